# Sourced (after cd to the repository root) by the scripts that run on the GPU machine: the
# environment every run there needs.
# - Python's NCCL 2.28.9 first: the system's NCCL 2.28.3 is older than the headers we build with.
# - NVLink multicast stays off (NCCL_NVLS_ENABLE=0): these machines must never use it.
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
# A bundle over the 64 MiB a call carries travels packed (COROLLA_PACK=1 scripts/build_gpu.sh,
# carry ["mgpu-bundle"]): unpack_bundle puts it into gpu-bundle/ (nothing to do without one).
unpack_bundle() {
  mkdir -p gpu-bundle || return 1
  if [ -f mgpu-bundle/b.tar.xz ]; then tar xJf mgpu-bundle/b.tar.xz -C gpu-bundle || return 1; fi
}
