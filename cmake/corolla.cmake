# corolla_library(NAME DIR DEPS ...): a static library of DIR's *.cc files, minus tests and fuzzers.
function(corolla_library name dir)
  file(GLOB srcs CONFIGURE_DEPENDS ${dir}/*.cc)
  list(FILTER srcs EXCLUDE REGEX "_(test|fuzz)\\.cc$")
  if(srcs)
    add_library(${name} STATIC ${srcs})
    target_link_libraries(${name} PUBLIC ${ARGN})
  else()  # a folder whose code has not landed yet
    add_library(${name} INTERFACE)
    target_link_libraries(${name} INTERFACE ${ARGN})
  endif()
endfunction()

# corolla_tests(NAME DIR DEPS ...): one GoogleTest binary of DIR's *_test.cc files, registered with CTest.
# Tests run from the source root so they find tests/data.
function(corolla_tests name dir)
  file(GLOB srcs CONFIGURE_DEPENDS ${dir}/*_test.cc)
  if(NOT srcs)
    return()
  endif()
  add_executable(${name} ${srcs})
  target_link_libraries(${name} PRIVATE ${ARGN} GTest::gtest GTest::gtest_main)
  gtest_discover_tests(${name} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} DISCOVERY_TIMEOUT 60
                       PROPERTIES LABELS ${name})
endfunction()
