# shellcheck shell=bash
# Sourced by scripts/test, scripts/test-django52, scripts/demo and .ci/run: prepares a venv,
# <repo>/.venv unless the caller sets KUMIKO_VENV_DIR first.
#
# - finds a Python >= 3.12 (set KUMIKO_PYTHON to force one), checked by running it;
# - creates the venv with it, or reuses it when its python runs and is >= 3.12;
# - installs -e '.[dev,demo]' (plus the requirements in KUMIKO_VENV_EXTRA, e.g. a Django
#   series for the 5.2 leg) when pyproject.toml, the extra requirements or the venv's python
#   changed since the last install (hash in <venv>/.kumiko-install-stamp).
#
# It installs nothing outside the venv. The browser tests' Debian chromium is installed by
# kumiko_ensure_chromium, which only scripts/test calls, and only when browser tests will run
# (scripts/demo never does).
#
# Exports KUMIKO_REPO_ROOT, KUMIKO_VENV_PYTHON and puts the repo root on PYTHONPATH, so that
# `python -m example_project...` and pytest work from any directory.
# Returns non-zero (without exiting the caller's shell) when the venv cannot be made.

KUMIKO_REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export KUMIKO_REPO_ROOT
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1

_kumiko_say() { printf '[venv] %s\n' "$*" >&2; }

# Prints the real path of a Python >= 3.12 given as a command (words), or fails.
_kumiko_check_python() {
    "$@" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1 \
        && "$@" -c 'import sys, venv; print(sys.executable)' 2>/dev/null
}

_kumiko_find_python() {
    local tried=() cand exe pyenv_root v
    local -a cands=()
    [ -n "${KUMIKO_PYTHON:-}" ] && cands+=("$KUMIKO_PYTHON")
    cands+=(python3.13 python3.12)
    if command -v pyenv >/dev/null 2>&1; then
        pyenv_root="$(pyenv root 2>/dev/null)"
    fi
    pyenv_root="${pyenv_root:-${PYENV_ROOT:-$HOME/.pyenv}}"
    for exe in "$pyenv_root"/versions/3.1[2-9]*/bin/python3.1[2-9]; do
        [ -x "$exe" ] && cands+=("$exe")
    done
    for cand in "${cands[@]}"; do
        tried+=("$cand")
        if exe="$(_kumiko_check_python "$cand")" && [ -n "$exe" ]; then
            printf '%s\n' "$exe"
            return 0
        fi
    done
    # pyenv shims only answer when told which version to use
    for v in "$pyenv_root"/versions/3.1[2-9]*; do
        [ -d "$v" ] || continue
        v="$(basename "$v")"
        for cand in "python${v%.*}" python3; do
            tried+=("PYENV_VERSION=$v $cand")
            if exe="$(PYENV_VERSION="$v" _kumiko_check_python "$cand")" && [ -n "$exe" ]; then
                printf '%s\n' "$exe"
                return 0
            fi
        done
    done
    tried+=(python3)
    if exe="$(_kumiko_check_python python3)" && [ -n "$exe" ]; then
        printf '%s\n' "$exe"
        return 0
    fi
    _kumiko_say "ERROR: no Python >= 3.12 found (Django 6 needs it). Tried:"
    for cand in "${tried[@]}"; do printf '    %s\n' "$cand" >&2; done
    _kumiko_say "Install one (e.g. 'pyenv install 3.12') or set KUMIKO_PYTHON=/path/to/python3.12."
    return 1
}

_kumiko_ensure_venv() {
    local venv="${KUMIKO_VENV_DIR:-$KUMIKO_REPO_ROOT/.venv}" py stamp_file want have
    local name extra="${KUMIKO_VENV_EXTRA:-}"
    name="$(basename "$venv")"
    local -a extra_reqs=()
    [ -n "$extra" ] && read -r -a extra_reqs <<<"$extra"
    if ! _kumiko_check_python "$venv/bin/python" >/dev/null; then
        py="$(_kumiko_find_python)" || return 1
        if [ -e "$venv" ]; then
            _kumiko_say "recreating $name (its python is missing, broken or older than 3.12)"
            rm -rf "$venv"
        fi
        _kumiko_say "creating $name with $py ($("$py" -V 2>&1))"
        "$py" -m venv "$venv" || { _kumiko_say "ERROR: '$py -m venv $venv' failed"; return 1; }
    fi

    stamp_file="$venv/.kumiko-install-stamp"
    # (the extra requirements join the hash only when given, so .venv's stamp is unchanged)
    want="$({ cat "$KUMIKO_REPO_ROOT/pyproject.toml"; "$venv/bin/python" -VV
        [ -z "$extra" ] || echo "$extra"; } | sha256sum | cut -d' ' -f1)"
    have="$(cat "$stamp_file" 2>/dev/null || true)"
    if [ "$want" != "$have" ]; then
        _kumiko_say "installing -e '.[dev,demo]' ${extra:+$extra }into $name" \
            "(pyproject.toml changed or first run)"
        rm -f "$stamp_file"
        # this machine's pip config names local index folders that may not exist; pip warns
        # about each one even with -q: drop those lines, keep everything else
        (cd "$KUMIKO_REPO_ROOT" && "$venv/bin/python" -m pip install -q \
            --disable-pip-version-check -e '.[dev,demo]' "${extra_reqs[@]}" 2>&1) \
            | grep -v "^WARNING: Location 'file:.*' is ignored: it is neither a file nor a directory" >&2
        if [ "${PIPESTATUS[0]}" -ne 0 ]; then
            _kumiko_say "ERROR: pip install -e '.[dev,demo]' failed (see above)"
            return 1
        fi
        printf '%s\n' "$want" >"$stamp_file"
    fi
    KUMIKO_VENV_PYTHON="$venv/bin/python"
    export KUMIKO_VENV_PYTHON
}

# Debian's chromium for Playwright (executablePath /usr/bin/chromium), for the browser tests
# only: called by scripts/test when they will run (so by .ci/run), never by the demo. Never
# fatal: without it those tests skip and say why. Playwright never downloads a browser of its
# own here (PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD). KUMIKO_NO_BROWSER_INSTALL=1 skips it.
kumiko_ensure_chromium() {
    [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] && return 0
    local log="${TMPDIR:-/tmp}/kumiko-apt-chromium.log"
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        _kumiko_say "WARNING: /usr/bin/chromium is missing and apt-get is not usable here" \
            "(not root or no apt-get); browser tests will be skipped"
        return 0
    fi
    if [ -n "${KUMIKO_NO_BROWSER_INSTALL:-}" ]; then
        _kumiko_say "browser tests will be skipped: /usr/bin/chromium is missing and" \
            "KUMIKO_NO_BROWSER_INSTALL is set"
        return 0
    fi
    _kumiko_say "the browser tests (tests/browser) need Debian's chromium + chromium-driver," \
        "which are missing: installing them system-wide with apt-get (~100 packages, log: $log)." \
        "Set KUMIKO_NO_BROWSER_INSTALL=1 to skip this (those tests then skip)."
    if timeout 300 apt-get update -q >"$log" 2>&1 \
        && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q \
            chromium chromium-driver >>"$log" 2>&1; then
        _kumiko_say "chromium installed: $(/usr/bin/chromium --version 2>/dev/null || echo '?')"
    else
        _kumiko_say "WARNING: apt-get could not install chromium (see $log);" \
            "browser tests will be skipped"
    fi
    return 0
}

_kumiko_ensure_venv || return 1
case ":${PYTHONPATH:-}:" in
*":$KUMIKO_REPO_ROOT:"*) ;;
*) export PYTHONPATH="$KUMIKO_REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" ;;
esac
