#!/usr/bin/env bash
# Regenerates kernels/*.ptx from kernels/*.cu. The PTX targets a low virtual architecture
# (compute_75) so the driver JIT-compiles it for the GPU it runs on, including newer ones.
#
#   scripts/gen-ptx.sh                 write kernels/NAME.ptx next to each kernels/NAME.cu, and copy
#                                      kernels/tensors.ptx into python/cuda_ipc/ (the Python package
#                                      loads the copy kernels from there: it is installed on its own)
#   scripts/gen-ptx.sh --out-dir DIR   write DIR/NAME.ptx instead (used by the PTX drift test)
#
# nvcc is $NVCC when set, else nvcc on PATH, else /usr/local/cuda/bin/nvcc.
# Output is deterministic for a given nvcc build: no line info, no file paths; nvcc runs from
# the kernels folder on the bare file name so nothing of the checkout location can leak in.
set -euo pipefail
export LC_ALL=C

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kernels_dir="$root/kernels"
out_dir="$kernels_dir"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --out-dir)
      if [[ $# -lt 2 ]]; then echo "gen-ptx: --out-dir needs a folder" >&2; exit 2; fi
      out_dir="$(mkdir -p "$2" && cd "$2" && pwd)"; shift 2 ;;
    *) echo "gen-ptx: unknown argument '$1' (usage: gen-ptx.sh [--out-dir DIR])" >&2; exit 2 ;;
  esac
done

nvcc="${NVCC:-}"
if [[ -z "$nvcc" ]]; then
  if command -v nvcc >/dev/null 2>&1; then nvcc="$(command -v nvcc)"
  elif [[ -x /usr/local/cuda/bin/nvcc ]]; then nvcc=/usr/local/cuda/bin/nvcc
  else echo "gen-ptx: nvcc not found; install the CUDA toolkit or set NVCC=/path/to/nvcc" >&2; exit 1
  fi
fi

# Keep in step with the flags the drift test expects (test/cpu/kernels-ptx.test.ts runs this script).
flags=(-ptx -arch=compute_75 -std=c++17 -O3)

shopt -s nullglob
sources=("$kernels_dir"/*.cu)
if [[ ${#sources[@]} -eq 0 ]]; then echo "gen-ptx: no kernels/*.cu found" >&2; exit 1; fi

cd "$kernels_dir"
for source in "${sources[@]}"; do
  name="$(basename "$source" .cu)"
  tmp="$out_dir/.$name.ptx.tmp"
  "$nvcc" "${flags[@]}" "$name.cu" -o "$tmp"
  mv -f "$tmp" "$out_dir/$name.ptx"
  echo "gen-ptx: $name.cu -> $out_dir/$name.ptx"
done
if [[ "$out_dir" == "$kernels_dir" && -f "$kernels_dir/tensors.ptx" ]]; then
  cp -f "$kernels_dir/tensors.ptx" "$root/python/cuda_ipc/tensors.ptx"
  echo "gen-ptx: tensors.ptx -> $root/python/cuda_ipc/tensors.ptx"
fi
