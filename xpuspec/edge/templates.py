"""The files an edge archive carries for the device: launchers, a systemd unit and a README.

Placeholders are ``@NAME@`` (shell and PowerShell use ``$`` and braces themselves).
"""

from __future__ import annotations

import re

RUN_SH = r"""#!/bin/sh
# Start the xpuspec server from this unpacked edge archive:
#   1. verify every file against edge.json (refuses a changed, missing or extra file);
#   2. create .venv beside this script and install xpuspec into it, once per archive
#      (offline from wheels/ when the archive has a wheelhouse);
#   3. exec `xpuspec serve` on ./bundle (the bundle's recorded device placement applies).
# Environment: XPUSPEC_HOST (default 127.0.0.1), XPUSPEC_PORT (default 8000),
#   XPUSPEC_PYTHON (default python3), XPUSPEC_API_KEY (optional bearer key).
# Extra arguments are passed to `xpuspec serve`, e.g. ./run.sh --target-device GPU
set -eu
here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
cd "$here"
python=${XPUSPEC_PYTHON:-python3}

if ! "$python" verify_edge.py "$here"; then
    echo "run.sh: this archive failed verification; not starting" >&2
    exit 1
fi

# The stamp holds edge.json's hash: unpacking a newer archive here reinstalls.
stamp=.venv/.xpuspec-edge-installed
hash_edge_json='import hashlib; print(hashlib.sha256(open("edge.json", "rb").read()).hexdigest())'
wanted=$("$python" -c "$hash_edge_json")
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
    if [ ! -x .venv/bin/python ]; then
        echo "run.sh: creating .venv" >&2
        "$python" -m venv .venv
    fi
    if [ -d wheels ]; then
        echo "run.sh: installing offline from wheels/" >&2
        .venv/bin/python -m pip install --disable-pip-version-check -q --no-index --find-links wheels \
            -r requirements.txt "dist/@WHEEL@"
    else
        echo "run.sh: installing from the package index (this archive has no wheelhouse)" >&2
        .venv/bin/python -m pip install --disable-pip-version-check -q -r requirements.txt "dist/@WHEEL@"
    fi
    echo "$wanted" > "$stamp"
fi

# Clients name the model as `xpuspec serve` does and README.md shows it (its plain name, not "bundle");
# the archive's older names stay aliases. A --served-model-name given here comes first.
names='import json; b = json.load(open("edge.json"))["bundle"]; print(b["name"], *b.get("aliases", []))'
for model in $("$python" -c "$names"); do
    set -- "$@" "--served-model-name=$model"
done
exec .venv/bin/xpuspec serve --bundle ./bundle \
    --host "${XPUSPEC_HOST:-127.0.0.1}" --port "${XPUSPEC_PORT:-8000}" "$@"
"""

RUN_PS1 = r"""# Start the xpuspec server from this unpacked edge archive (Windows):
#   verify every file against edge.json, install into .venv once per archive (offline from wheels\
#   when present), then run `xpuspec serve` on .\bundle with the bundle's recorded placement.
# Environment: XPUSPEC_HOST (default 127.0.0.1), XPUSPEC_PORT (default 8000), XPUSPEC_PYTHON (default python).
# Run: powershell -ExecutionPolicy Bypass -File run.ps1 [extra xpuspec serve arguments]
$ErrorActionPreference = "Stop"
Set-Location -LiteralPath $PSScriptRoot

$python = if ($env:XPUSPEC_PYTHON) { $env:XPUSPEC_PYTHON } else { "python" }

& $python verify_edge.py $PSScriptRoot
if ($LASTEXITCODE -ne 0) { Write-Error "run.ps1: this archive failed verification; not starting"; exit 1 }

$stamp = Join-Path ".venv" ".xpuspec-edge-installed"
$wanted = (Get-FileHash -Algorithm SHA256 -LiteralPath "edge.json").Hash.ToLower()
$installed = if (Test-Path $stamp) { (Get-Content -LiteralPath $stamp -Raw).Trim() } else { "" }
if ($installed -ne $wanted) {
    if (-not (Test-Path ".venv\Scripts\python.exe")) {
        & $python -m venv .venv
        if ($LASTEXITCODE -ne 0) { exit $LASTEXITCODE }
    }
    $pipArgs = @("-m", "pip", "install", "--disable-pip-version-check", "-q")
    if (Test-Path "wheels") { $pipArgs += @("--no-index", "--find-links", "wheels") }
    & ".venv\Scripts\python.exe" @pipArgs -r requirements.txt "dist\@WHEEL@"
    if ($LASTEXITCODE -ne 0) { Write-Error "run.ps1: installing xpuspec failed"; exit $LASTEXITCODE }
    Set-Content -LiteralPath $stamp -Value $wanted
}

$listenHost = if ($env:XPUSPEC_HOST) { $env:XPUSPEC_HOST } else { "127.0.0.1" }
$listenPort = if ($env:XPUSPEC_PORT) { $env:XPUSPEC_PORT } else { "8000" }
# Clients name the model as `xpuspec serve` does and README.md shows it (its plain name); the
# archive's older names stay aliases.
$bundleFacts = (Get-Content -LiteralPath "edge.json" -Raw | ConvertFrom-Json).bundle
$nameArgs = @(@($bundleFacts.name) + @($bundleFacts.aliases) | Where-Object { $_ } |
    ForEach-Object { "--served-model-name=$_" })
& ".venv\Scripts\xpuspec.exe" serve --bundle .\bundle --host $listenHost --port $listenPort @args @nameArgs
exit $LASTEXITCODE
"""

SYSTEMD_UNIT = """# Example systemd unit. Unpack the archive to /opt/xpuspec-edge, create the user
# (useradd --system --home /opt/xpuspec-edge xpuspec; chown -R xpuspec /opt/xpuspec-edge),
# copy this file to /etc/systemd/system/xpuspec-edge.service, then:
#   systemctl daemon-reload && systemctl enable --now xpuspec-edge
[Unit]
Description=xpuspec speculative-decoding server (@BUNDLE@)
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
User=xpuspec
# /dev/dri (GPU) and /dev/accel (NPU) belong to these groups on Ubuntu.
SupplementalGroups=render video
WorkingDirectory=/opt/xpuspec-edge
Environment=XPUSPEC_HOST=127.0.0.1
Environment=XPUSPEC_PORT=8000
# Environment=XPUSPEC_API_KEY=change-me
ExecStart=/bin/sh /opt/xpuspec-edge/run.sh
# SIGTERM drains in-flight requests (up to 120 s) before the server exits.
KillSignal=SIGTERM
TimeoutStopSec=150
Restart=on-failure
RestartSec=5

[Install]
WantedBy=multi-user.target
"""

README = """# xpuspec edge archive: @BUNDLE@

Made by `xpuspec bundle` (xpuspec @VERSION@) on @CREATED_AT@.

## Contents
- `bundle/` the model bundle (OpenVINO IR, tokenizer, `xpuspec.json`)
- `dist/@WHEEL@` xpuspec itself
- `requirements.txt` its runtime requirements, pinned (no torch, transformers, optimum or nncf)
- `wheels/` @WHEELHOUSE@
- `run.sh`, `run.ps1` launchers; `xpuspec-edge.service` an example systemd unit
- `verify_edge.py` the verifier (standard library only); `edge.json` the SHA-256 of every file

## Run
Needs Python @PYTHON@ (`python3 -m venv` must work: on Debian/Ubuntu `apt install python3-venv`).

    tar -xzf edge.tar.gz && cd @ROOT@
    ./run.sh                                  # Linux; XPUSPEC_HOST / XPUSPEC_PORT change the address
    powershell -ExecutionPolicy Bypass -File run.ps1    # Windows

The launcher verifies the files, installs into `.venv` beside it once, then serves the
OpenAI-compatible API: `curl http://127.0.0.1:8000/health`; requests name the model
`@BUNDLE@`, as `xpuspec serve` does@ALIASES@ (extra names: `./run.sh --served-model-name other`),
and a chat page at `http://127.0.0.1:8000/` (in the archive: it fetches nothing from elsewhere).
It listens on loopback only unless `XPUSPEC_HOST=0.0.0.0`; set `XPUSPEC_API_KEY` before exposing it.

Device placement: @PLACEMENT@
Arguments after `./run.sh` go to `xpuspec serve` (e.g. `--target-device GPU --draft-device NPU`).

## Verify by hand

    python3 verify_edge.py edge.tar.gz    # or the unpacked folder
"""


def render(template: str, **values: str) -> str:
    """``template`` with every ``@NAME@`` replaced; a placeholder left without a value is an error."""
    text = template
    for name, value in values.items():
        text = text.replace(f"@{name.upper()}@", value)
    leftover = re.findall(r"@[A-Z_]+@", text)
    if leftover:
        raise ValueError(f"template placeholders without a value: {sorted(set(leftover))}")
    return text
