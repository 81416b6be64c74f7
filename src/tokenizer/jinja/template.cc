#include "tokenizer/jinja/template.h"

#include "tokenizer/jinja/renderer.h"

namespace corolla::jinja {

Result<std::shared_ptr<const Template>> Template::Parse(std::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  ASSIGN_OR_RETURN(Body body, ParseTokens(tokens));
  std::shared_ptr<Template> t(new Template());
  t->body_ = std::move(body);
  return std::shared_ptr<const Template>(std::move(t));
}

Result<std::string> Template::RenderValue(const Value& context, const RenderLimits& limits) const {
  if (!context.is_dict()) {
    return InvalidArgument("template context must be a mapping, got " + context.TypeName());
  }
  Renderer renderer(context, limits);
  return renderer.Run(body_);
}

Result<std::string> Template::Render(const nlohmann::json& context,
                                     const RenderLimits& limits) const {
  return RenderValue(Value::FromJson(context), limits);
}

Result<std::string> Template::Render(const nlohmann::ordered_json& context,
                                     const RenderLimits& limits) const {
  return RenderValue(Value::FromJson(context), limits);
}

}  // namespace corolla::jinja
