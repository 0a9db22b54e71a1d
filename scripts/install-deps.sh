#!/usr/bin/env bash
# Installs what building and testing rampart needs on Debian/Ubuntu, skipping what is present:
# a C toolchain, cmake and libclang (BoringSSL and aws-lc), protoc (the etcd client's gRPC
# code), curl, openssl, etcd and Redis (tests), ModSecurity and the OWASP CRS (the WAF), and Rust.
set -euo pipefail

need=()
command -v cc >/dev/null || need+=(build-essential)
command -v c++ >/dev/null || need+=(g++)
command -v cmake >/dev/null || need+=(cmake)
command -v git >/dev/null || need+=(git)
command -v curl >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v protoc >/dev/null || need+=(protobuf-compiler)
# The control plane's tests start a real etcd.
command -v etcd >/dev/null || need+=(etcd-server)
# Fleet state (fleet rate limits) lives in Redis; its tests start a real one.
command -v redis-server >/dev/null || need+=(redis-server)
# The WAF: ModSecurity v3 (loaded at run time) and the OWASP Core Rule Set; its tests run them.
ls /usr/lib/*/libmodsecurity.so.3 >/dev/null 2>&1 || need+=(libmodsecurity3)
[ -d /usr/share/modsecurity-crs/rules ] || need+=(modsecurity-crs)
# The tracing tests' OTLP receiver parses with protobuf (Debian) and the OpenTelemetry
# protocol's definitions (PyPI, below); pip fetches them.
[ -d /usr/lib/python3/dist-packages/google/protobuf ] || need+=(python3-protobuf)
/usr/bin/python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
# bindgen (boring-sys) needs libclang and clang's resource headers.
ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || need+=(libclang-dev)
ls /usr/lib/llvm-*/lib/clang/*/include/stddef.h >/dev/null 2>&1 || need+=(clang)
if [ "${WITH_BENCH_TOOLS:-0}" = 1 ]; then
  command -v nginx >/dev/null || need+=(nginx-light)
  # The WAF benchmark's reference: nginx with ModSecurity and the same Core Rule Set.
  [ -e /usr/lib/nginx/modules/ngx_http_modsecurity_module.so ] || need+=(libnginx-mod-http-modsecurity)
fi

if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The OpenTelemetry protocol's Python definitions for the OTLP receiver the tracing tests run,
# unpacked (pure Python) into target/pydeps rather than installed into the system's Python.
pydeps=$(cd "$(dirname "$0")/.." && pwd)/target/pydeps
if [ ! -d "$pydeps/opentelemetry/proto" ]; then
  rm -rf "$pydeps.tmp" && mkdir -p "$pydeps.tmp"
  /usr/bin/python3 -m pip download -q --no-deps -d "$pydeps.tmp" opentelemetry-proto==1.27.0
  /usr/bin/python3 -m zipfile -e "$pydeps.tmp/opentelemetry_proto-1.27.0-py3-none-any.whl" "$pydeps"
  rm -rf "$pydeps.tmp"
fi

# The HTTP/3 interop tests use an independent client: Python aioquic.
if ! python3 -c 'import aioquic' 2>/dev/null; then
  echo "installing aioquic (HTTP/3 test client)"
  python3 -m pip install -q aioquic 2>/dev/null \
    || python3 -m pip install -q --break-system-packages aioquic 2>/dev/null \
    || { SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"; $SUDO apt-get install -y -qq python3-aioquic >/dev/null; }
fi

if ! command -v cargo >/dev/null; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    echo "Rust is installed in ~/.cargo/bin; add it to PATH"
  else
    echo "installing Rust (rustup, from Debian)"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq rustup >/dev/null || true
    rustup default stable
  fi
fi
# `make lint` needs rustfmt and clippy (rustup's default profile has them; a minimal one not).
if command -v rustup >/dev/null && ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add clippy rustfmt >/dev/null 2>&1 || true
fi
