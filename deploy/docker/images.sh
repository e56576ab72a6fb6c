#!/usr/bin/env bash
# Build tritonnx's images without an image registry (make images, make wheelhouse, make docker-engine).
#
#   deploy/docker/images.sh engine      install and start the Docker engine when none answers (and the tools below)
#   deploy/docker/images.sh wheelhouse  every Python package the images install, as wheels in build/wheelhouse/
#   deploy/docker/images.sh base        tritonnx/debian:bookworm, a minimal Debian with Python 3.11, from debootstrap
#   deploy/docker/images.sh standin     tritonnx/tritonserver:24.10-py3-standin, the NGC image's layout
#   deploy/docker/images.sh cpu         tritonnx:cpu, the slim image without models, and tritonnx:demo, the same with
#                                       the demo models (deploy/docker/Dockerfile.cpu)
#   deploy/docker/images.sh ngc         tritonnx:ngc, the Dockerfile on BASE_IMAGE (default: the stand-in)
#   deploy/docker/images.sh all         all of the above, in that order
#
# Environment: BASE_IMAGE (the NGC image to build tritonnx:ngc on; with nvcr.io/nvidia/tritonserver:24.10-py3
# give WHEEL_PYTHON=3.10, its Python), WHEEL_PYTHON (the images' Python, default 3.11), DEBIAN_MIRROR.
# Builds use the host's network (no bridge here) and Docker's classic builder, which every engine has.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PY:-.venv/bin/python}
WHEEL_PYTHON=${WHEEL_PYTHON:-3.11}
WHEELHOUSE=build/wheelhouse/py${WHEEL_PYTHON}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE=tritonnx/debian:bookworm
STANDIN=tritonnx/tritonserver:24.10-py3-standin
BASE_IMAGE=${BASE_IMAGE:-$STANDIN}
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
UNNEEDED_PACKAGES="apt libapt-pkg6.0 gpgv debian-archive-keyring libgnutls30 libp11-kit0 libidn2-0 libunistring2
    libtasn1-6 libnettle8 libhogweed6 libgmp10 libgcrypt20 libgpg-error0 libsystemd0 liblz4-1 e2fsprogs libext2fs2
    libss2 logsave tzdata adduser passwd login libpam-modules libpam-modules-bin libpam-runtime libpam0g libsemanage2
    libsemanage-common libsepol2 libaudit1 libaudit-common libcap-ng0 debconf perl-base util-linux mount libmount1
    libsmartcols1 sysvinit-utils"
export DOCKER_BUILDKIT=0

say() { echo "[$(date +%H:%M:%S)] $*"; }
die() { echo "error: $*" >&2; exit 1; }
has_image() { docker image inspect "$1" >/dev/null 2>&1; }
build() {  # build TAG DOCKERFILE [build args...]
    local tag=$1 file=$2; shift 2
    say "building $tag ($file)"
    local started=$SECONDS
    docker build --network host -q -t "$tag" -f "$file" "$@" . >/dev/null
    say "  $tag: $(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1 / 1e6}') in $((SECONDS - started)) s"
}

tools() {  # what the build uses, from Debian: the engine, debootstrap, strip, docker-compose (for the tests)
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v strip >/dev/null || missing+=(binutils)
    command -v docker-compose >/dev/null || missing+=(docker-compose)
    if [ ${#missing[@]} -gt 0 ]; then
        say "installing ${missing[*]} (Debian's packages)"
        $SUDO apt-get update -qq
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

engine() {
    tools
    if docker info >/dev/null 2>&1; then return; fi
    mkdir -p build
    say "starting dockerd (no bridge, no iptables: containers run on the host's network); log: build/dockerd.log"
    $SUDO setsid dockerd --bridge=none --iptables=false >build/dockerd.log 2>&1 </dev/null &
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && return
        sleep 1
    done
    die "dockerd did not answer within 60 s: see build/dockerd.log"
}

wheelhouse() {
    local stamp=$WHEELHOUSE/.complete
    if [ -f "$stamp" ] && [ "$stamp" -nt deploy/docker/requirements-image.txt ] && [ "$stamp" -nt pyproject.toml ] \
        && [ -z "$(find backend client tritonnx -newer "$stamp" -name '*.py' -print -quit)" ]; then
        say "wheelhouse $WHEELHOUSE is up to date"
        return
    fi
    tools
    say "filling $WHEELHOUSE for Python $WHEEL_PYTHON (pip inside a build cannot reach the package registry)"
    rm -rf "$WHEELHOUSE" && mkdir -p "$WHEELHOUSE"
    local platform=(--only-binary=:all: --python-version "$WHEEL_PYTHON" --implementation cp
                    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64
                    --platform manylinux_2_35_x86_64)
    # pip evaluates environment markers for its own Python, not the target's: resolve them for $WHEEL_PYTHON.
    local pinned=$WHEELHOUSE/.pins.txt
    $PY - "$WHEEL_PYTHON" deploy/docker/requirements-image.txt deploy/docker/requirements-models.txt \
        requirements-triton.txt > "$pinned" <<'EOF'
import sys
from pathlib import Path

from packaging.requirements import Requirement

for name in sys.argv[2:]:
    for line in Path(name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            marker = Requirement(line).marker
            if marker is None or marker.evaluate({"python_version": sys.argv[1]}):
                print(line.split(";")[0].strip())
EOF
    $PY -m pip download -q --no-deps "${platform[@]}" -d "$WHEELHOUSE" -r "$pinned" pip==24.3.1 2>&1 \
        | { grep -v '^WARNING: Location' || true; }
    [ "${PIPESTATUS[0]}" = 0 ] || die "pip download failed"
    rm -rf build/lib  # setuptools builds there and would ship a module removed since
    $PY -m pip wheel -q --no-deps -w "$WHEELHOUSE" .  # tritonnx itself
    tritonserver_tree
    cp deploy/docker/requirements-image.txt deploy/docker/requirements-models.txt "$WHEELHOUSE/"
    touch "$stamp"
    say "  $(ls "$WHEELHOUSE"/*.whl | wc -l) wheels, $(du -sh "$WHEELHOUSE" | cut -f1)"
}

tritonserver_tree() {
    # tritonserver in the NGC layout, from the nvidia-pytriton wheel: the binary, the Python backend
    # with the stub for the images' Python, and the libraries they load (not the wheel's
    # libpython3.13, 31 MB, which only another stub uses); symbols stripped, as NGC ships them.
    local tree=$WHEELHOUSE/tritonserver unpacked
    unpacked=$(mktemp -d)
    $PY -m zipfile -e "$WHEELHOUSE"/nvidia_pytriton-*.whl "$unpacked"
    local wheel=$unpacked/pytriton/tritonserver
    mkdir -p "$tree/bin" "$tree/lib" "$tree/backends/python"
    cp "$wheel/bin/tritonserver" "$tree/bin/"
    cp "$wheel/backends/python/libtriton_python.so" "$wheel/backends/python/triton_python_backend_utils.py" \
        "$wheel/python_backend_stubs/$WHEEL_PYTHON/triton_python_backend_stub" "$tree/backends/python/"
    cp "$unpacked"/nvidia_pytriton.libs/*.so* "$tree/lib/"
    rm "$tree"/lib/libpython3-*.so*
    chmod 755 "$tree/bin/tritonserver" "$tree/backends/python/triton_python_backend_stub"
    strip --strip-unneeded "$tree/bin/tritonserver" "$tree/backends/python/"*.so "$tree/backends/python/triton_python_backend_stub" "$tree"/lib/*
    rm -rf "$unpacked"
    say "  tritonserver in the NGC layout: $(du -sh "$tree" | cut -f1)"
}

base() {
    if has_image "$BASE"; then return; fi
    local root
    root=$(mktemp -d /tmp/tritonnx-rootfs.XXXXXX)
    say "debootstrap: Debian bookworm, minbase, with Python 3.11 and tini into $root (about a minute)"
    $SUDO debootstrap --variant=minbase --include=python3,libpython3.11,tini bookworm "$root" "$DEBIAN_MIRROR" >/dev/null
    # What a container that never installs a package and never logs anyone in does not use: the
    # package manager, its keys and crypto, PAM and the login tools, filesystem tools, perl and
    # debconf (for package scripts), the time zone database. dpkg and its database stay, so
    # scanners still see what the image holds.
    # Their removal scripts may fail once perl and debconf are gone: what counts is what is left.
    $SUDO chroot "$root" dpkg --purge --force-remove-essential --force-depends $UNNEEDED_PACKAGES >/dev/null 2>&1 || true
    $SUDO chroot "$root" python3 -c 'import asyncio, ctypes, json, ssl' || die "the trimmed base cannot run Python"
    # What a container never reads: package lists and caches, documentation, man pages, translations,
    # and the standard library's parts a server never imports (2to3, pydoc's data, ensurepip, IDLE, Tk).
    $SUDO rm -rf "$root"/usr/lib/python3.11/{lib2to3,pydoc_data,ensurepip,idlelib,turtledemo,tkinter}
    $SUDO rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
        "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
    $SUDO tar -C "$root" -c . | docker import -c 'ENV LANG=C.UTF-8' - "$BASE" >/dev/null
    $SUDO rm -rf "$root"
    say "  $BASE: $(docker image inspect -f '{{.Size}}' "$BASE" | awk '{printf "%.0f MB", $1 / 1e6}')"
}

standin() {
    if has_image "$STANDIN"; then return; fi
    base
    wheelhouse
    build "$STANDIN" deploy/docker/Dockerfile.standin --build-arg "WHEELHOUSE=$WHEELHOUSE"
}

# Each step on its own line: `set -e` does not stop a function called inside an && list.
case "${1:-all}" in
    engine)
        engine
        ;;
    wheelhouse)
        wheelhouse
        ;;
    base)
        engine
        base
        ;;
    standin)
        engine
        standin
        ;;
    cpu)
        engine
        base
        wheelhouse
        build tritonnx:cpu deploy/docker/Dockerfile.cpu --target cpu --build-arg "WHEELHOUSE=$WHEELHOUSE"
        build tritonnx:demo deploy/docker/Dockerfile.cpu --target demo --build-arg "WHEELHOUSE=$WHEELHOUSE"
        ;;
    ngc)
        engine
        wheelhouse
        if [ "$BASE_IMAGE" = "$STANDIN" ]; then standin; fi
        build tritonnx:ngc Dockerfile --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "WHEELHOUSE=$WHEELHOUSE"
        ;;
    all)
        "$0" cpu
        "$0" ngc
        ;;
    *)
        sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
        exit 2
        ;;
esac
