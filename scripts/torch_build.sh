# Sourced by scripts/setup and scripts/bundle: which torch build to install or bundle, and where from.
# Without a choice pip takes PyPI's default Linux wheel, the multi-GB CUDA build, even on a box
# with no GPU; the CPU build comes from PyTorch's own index.

# The exact torch version CI tests: constraints.txt's pin (ROOT is the checkout or the bundle).
torch_pinned_version() {
  sed -n 's/^torch==\([0-9][^ ;#]*\).*/\1/p' "$1/constraints.txt" 2>/dev/null | head -n 1
}

# The build to use when none is asked for: cuda when nvidia-smi sees a GPU, else cpu.
torch_default_build() {
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then echo cuda; else echo cpu; fi
}

# Sets torch_req (the requirement) and torch_index (pip's index arguments) for BUILD and VERSION;
# returns 1 for a BUILD other than cpu or cuda.
torch_source() {
  case "$1" in
    cpu)  torch_req="torch==$2+cpu"; torch_index=(--extra-index-url https://download.pytorch.org/whl/cpu) ;;
    cuda) torch_req="torch==$2"; torch_index=() ;;
    *) return 1 ;;
  esac
}
