#!/usr/bin/env bash
# Pack what benchmarks/gpu.sh needs on a GPU machine where nothing can be fetched (the lent
# H200: Python 3.12, nvcc, CMake and ninja, numpy; at most 64 MiB travels with a command):
#   .gpu-carry/llama-src.tar.xz  the llama.cpp sources llama-cpp-python 0.3.36 vendors, trimmed
#                                to what the CPU and CUDA builds need (~5 MB)
#   .gpu-carry/meta.gguf         the embedded model's metadata and tensor shapes, no weights (~7 MB)
#   .gpu-carry/whl/              wheels missing there (msgspec, websockets, uvicorn, starlette,
#                                httptools, diskcache) for $PYVER (3.12)
#   .gpu-carry/py/llama_cpp/     llama-cpp-python's Python side (its libraries come from the build)
#   .gpu-carry/run.sh            the command to run there
# Then, with the device tool: run(command="bash .gpu-carry/run.sh", carry=[".gpu-carry"]).
#   bash benchmarks/gpu_carry.sh
# Measures nothing itself; prints the size of each packed part. run.sh leaves gpu.sh's results
# in $OUT/gpu (default /tmp/gpu-out/gpu).
# To try it here first, also carry what the H200's image already has: PYVER=3.11 EXTRA="numpy
# anyio h11 click idna sniffio typing_extensions jinja2 markupsafe", then
# GPU=cpu bash .gpu-carry/run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${PYVER:-3.12}
C=.gpu-carry
rm -rf "$C" && mkdir -p "$C/whl" "$C/py"
src=$(mktemp -d)
.venv/bin/python -m pip download -q --no-deps --no-binary :all: -d "$src" llama-cpp-python==0.3.36
tar xzf "$src"/llama_cpp_python-0.3.36.tar.gz -C "$src"
( cd "$src/llama_cpp_python-0.3.36/vendor/llama.cpp" &&
  tar --exclude='ggml/src/ggml-sycl' --exclude='ggml/src/ggml-vulkan' --exclude='ggml/src/ggml-opencl' \
      --exclude='ggml/src/ggml-metal' --exclude='ggml/src/ggml-hexagon' --exclude='ggml/src/ggml-et' \
      --exclude='ggml/src/ggml-cann' --exclude='ggml/src/ggml-musa' --exclude='ggml/src/ggml-webgpu' \
      --exclude='*/tests' -cJf - CMakeLists.txt cmake ggml src include common tools vendor gguf-py app scripts \
      LICENSE licenses ) >"$C/llama-src.tar.xz"
model=$(.venv/bin/python -c "from localserve.runners.models import ensure_embedded; print(ensure_embedded())")
.venv/bin/python scripts/random_gguf.py --metadata-only "$model" "$C/meta.gguf" \
  --gguf-py "$src/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
  --implementation cp "${platforms[@]}" -d "$C/whl" \
  msgspec websockets uvicorn starlette httptools diskcache ${EXTRA:-}
site=$(.venv/bin/python -c "import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))")
mkdir -p "$C/py/llama_cpp"
( cd "$site" && tar --exclude=./lib --exclude='__pycache__' -cf - . ) | tar xf - -C "$C/py/llama_cpp"
cat >"$C/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the GPU machine, from the repository root: install what was carried, build, benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .gpu-carry/whl/*.whl
mkdir -p /tmp/llama-src && tar xJf .gpu-carry/llama-src.tar.xz -C /tmp/llama-src
export PYTHONPATH=/tmp/site:$PWD/.gpu-carry/py:$PWD PYTHONUNBUFFERED=1
GPU=${GPU:-cuda} LLAMA_SRC=/tmp/llama-src META=.gpu-carry/meta.gguf PY=python3 \
  LS="python3 -m localserve" BUILD=${BUILD:-/tmp/llama-build} \
  bash benchmarks/gpu.sh "${OUT:-/tmp/gpu-out}/gpu"
RUN
chmod +x "$C/run.sh"
du -sh "$C" "$C"/*
