#!/usr/bin/env bash
# Issues the mutual-TLS certificates of a key-server cluster with openssl:
#   ca.crt/ca.key             the CA both sides trust
#   keyserver.crt/.key        a key server's identity (name: $KEYSERVER_NAME)
#   gateway.crt/.key          a gateway's client identity
# Usage: scripts/issue-keyless-pki.sh [DIR] (default state/pki). Existing files are kept.
set -euo pipefail
DIR=${1:-state/pki}
KEYSERVER_NAME=${KEYSERVER_NAME:-keyserver.internal}
mkdir -p "$DIR" && cd "$DIR"
umask 077
ec() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "$@" 2>/dev/null; }
if [ ! -f ca.crt ]; then
  ec -x509 -days 3650 -keyout ca.key -out ca.crt -subj "/CN=rampart key-server CA" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
fi
issue() { # $1 = stem, $2 = subject CN, $3 = extensions
  [ -f "$1.crt" ] && return 0
  ec -keyout "$1.key" -out "$1.csr" -subj "/CN=$2"
  printf '%b' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
    -out "$1.crt" -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
issue keyserver "$KEYSERVER_NAME" "subjectAltName=DNS:$KEYSERVER_NAME\nextendedKeyUsage=serverAuth\n"
issue gateway gateway-1 "extendedKeyUsage=clientAuth\n"
echo "issued in $DIR: ca.crt, keyserver.crt/.key ($KEYSERVER_NAME), gateway.crt/.key"
