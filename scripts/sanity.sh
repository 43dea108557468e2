#!/usr/bin/env bash
# ansible-core's own sanity tests (`ansible-test sanity`) on the project's modules (library/) and
# module utils (module_utils/). ansible-test only runs inside a collection, so this builds a
# throwaway one under a temp dir: ansible_collections/hicache/fleet/plugins/{modules,module_utils},
# with the imports rewritten from ansible.module_utils.<name> (how Ansible finds a playbook-adjacent
# module_utils/, ansible.cfg) to the collection's path. The findings it may keep, each with its
# reason, are in scripts/sanity-ignore.txt.
#
# No docker: the local interpreter (--python, default the controller venv's). ansible-test keeps
# each test's requirements in its own virtualenvs under $SANITY_HOME (.cache/sanity, reused), filled
# from the package index on the first run; the tests themselves run offline.
#
#   scripts/sanity.sh            every sanity test that applies
#   scripts/sanity.sh --test validate-modules
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/.venv/bin}
PYVER=${SANITY_PYTHON:-$("$BIN/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')}
SANITY_HOME=${SANITY_HOME:-$ROOT/.cache/sanity}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

COLL=$WORK/ansible_collections/hicache/fleet
mkdir -p "$COLL/plugins/modules" "$COLL/plugins/module_utils" "$COLL/tests/sanity" "$COLL/meta"
cp "$ROOT"/library/*.py "$COLL/plugins/modules/"
cp "$ROOT"/module_utils/*.py "$COLL/plugins/module_utils/"
sed -i -E 's/\bansible\.module_utils\.((sglang|fleet)_[a-z_]+)/ansible_collections.hicache.fleet.plugins.module_utils.\1/g' \
  "$COLL"/plugins/modules/*.py "$COLL"/plugins/module_utils/*.py
cat > "$COLL/galaxy.yml" <<'EOF'
namespace: hicache
name: fleet
version: 0.1.0
readme: README.md
authors: [hicache-fleet]
EOF
printf '# hicache.fleet\nThrowaway layout for ansible-test sanity (scripts/sanity.sh).\n' > "$COLL/README.md"
printf -- '---\nrequires_ansible: ">=2.17"\n' > "$COLL/meta/runtime.yml"
# The modules run on the managed host with its Python 3.11 or later (datetime.UTC, zip strict).
printf -- '---\nmodules:\n  python_requires: ">=3.11"\n' > "$COLL/tests/config.yml"
ANSIBLE_VERSION=$("$BIN/python" -c 'import ansible.release as r; print(".".join(r.__version__.split(".")[:2]))')
grep -v -E '^\s*(#|$)' "$ROOT/scripts/sanity-ignore.txt" > "$COLL/tests/sanity/ignore-$ANSIBLE_VERSION.txt" || true
# ansible-test wants a source tree under version control or none at all; git it so file lists are exact.
git -C "$COLL" init -q && git -C "$COLL" add -A

# ansible-test bootstraps pip in each requirements venv with a get-pip.py it downloads from a host
# outside the package index. This stand-in does the same with the interpreter's own ensurepip (in a
# subprocess: ensurepip disables pip's configuration for the process that calls it) and the index.
PIP_VERSION=$(sed -n -E "s/^ *pip='([0-9.]+)',.*/\1/p" \
  "$("$BIN/python" -c 'import ansible_test, os; print(os.path.dirname(ansible_test.__file__))')/_internal/python_requirements.py")
mkdir -p "$SANITY_HOME/.ansible/test/cache"
cat > "$SANITY_HOME/.ansible/test/cache/get_pip_${PIP_VERSION//./_}.py" <<'EOF'
"""Stand-in for get-pip.py (scripts/sanity.sh): ensurepip's bundled pip, then `pip install ARGS`."""
import subprocess
import sys

subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", "--quiet", *args]))
EOF

cd "$COLL"
echo "ansible-test sanity (ansible-core $ANSIBLE_VERSION, Python $PYVER) on: $(cd plugins && ls modules/*.py module_utils/*.py | tr '\n' ' ')"
HOME=$SANITY_HOME "$BIN/ansible-test" sanity --python "$PYVER" --color no "$@"
