#!/bin/sh
# Installs what tests/test_k8s.py needs to render and validate k8s/ offline (`make k8s-tools`):
#   kustomize, kubeconform and helm (for tests/test_helm.py), built from the Go module proxy
#   with `go install`;
#   the Kubernetes JSON schemas bundled in the PyPI package kubernetes-validate, laid out for
#   kubeconform by k8s/schemas/kubernetes_schemas.py;
#   PyYAML in $PYTHON's environment, for the tests to read what kustomize renders.
# Everything goes to $K8S_TOOLS_DIR (default ~/.cache/mcp-kafka-bridge/k8s-tools); each piece
# is installed only if its version is missing, so a second run does nothing.
set -eu

KUSTOMIZE_VERSION=v5.8.1        # v5.8.2+ need Go 1.27
KUBECONFORM_VERSION=v0.8.0
HELM_VERSION=v3.22.0
KUBERNETES_VALIDATE_VERSION=1.37.0

DIR=${K8S_TOOLS_DIR:-$HOME/.cache/mcp-kafka-bridge/k8s-tools}
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$DIR/bin"

go_tool() {  # name module version
  if [ ! -f "$DIR/bin/.$1-$3" ] || [ ! -x "$DIR/bin/$1" ]; then
    command -v go >/dev/null || { echo "Go is needed to install $1 (go install $2@$3)" >&2; exit 1; }
    echo "installing $1 $3 into $DIR/bin"
    GOBIN="$DIR/bin" GOFLAGS=-buildvcs=false go install "$2@$3"
    rm -f "$DIR/bin/.$1-"*
    touch "$DIR/bin/.$1-$3"
  fi
}

go_tool kustomize sigs.k8s.io/kustomize/kustomize/v5 "$KUSTOMIZE_VERSION"
go_tool kubeconform github.com/yannh/kubeconform/cmd/kubeconform "$KUBECONFORM_VERSION"
go_tool helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION"

SITE="$DIR/kubernetes-validate-$KUBERNETES_VALIDATE_VERSION"
if [ ! -d "$SITE/kubernetes_validate" ]; then
  echo "installing the Kubernetes JSON schemas of kubernetes-validate $KUBERNETES_VALIDATE_VERSION (PyPI)"
  rm -rf "$SITE.partial"
  "$PYTHON" -m pip install -q --disable-pip-version-check --no-deps --target "$SITE.partial" \
    "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
  mv "$SITE.partial" "$SITE"
  rm -rf "$DIR/kubernetes-json-schema"  # laid out from another version: redo
fi
"$PYTHON" "$HERE/schemas/kubernetes_schemas.py" "$SITE" "$DIR/kubernetes-json-schema"

"$PYTHON" -c "import yaml" 2>/dev/null || {
  echo "installing PyYAML (PyPI) for tests/test_k8s.py"
  "$PYTHON" -m pip install -q --disable-pip-version-check "pyyaml>=6,<7"
}
