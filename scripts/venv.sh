# Sourced by the setup scripts: how each of our virtual environments comes to exist.
# ensure_venv PYTHON VENV: create VENV with PYTHON unless it already has an interpreter (idempotent);
# the caller has checked PYTHON's version and defines say().
ensure_venv() {
    if [ ! -x "$2/bin/python" ]; then
        say "creating $2"
        "$1" -m venv "$2"
    fi
}
