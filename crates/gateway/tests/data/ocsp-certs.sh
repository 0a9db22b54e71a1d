#!/bin/sh
# Makes, in the current folder, for the OCSP stapling tests: a CA; `site` (localhost, RSA) and
# `other` (localhost, RSA) issued by it, with `site-chain.pem` / `other-chain.pem` (leaf, then
# the CA) and their keys; the CA's OCSP responses (signed by the CA itself, as `openssl ocsp`
# answers): `site-good.der` (site good, next update in a day), `other-good.der` (other good),
# `site-revoked.der` (site revoked), `site-short.der` (site good, next update in 2 minutes), and
# `site-delegated.der` (site good, signed by a responder certificate the CA issued for OCSP
# signing). `index.txt` is the CA's database (an `openssl ocsp -port` responder can serve it).
set -e
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=site-ca 2>/dev/null
for who in site other; do
  openssl req -newkey rsa:2048 -nodes -keyout $who.key -out $who.csr -subj "/CN=localhost" 2>/dev/null
  printf "subjectAltName=DNS:localhost\nauthorityInfoAccess=OCSP;URI:http://127.0.0.1:${OCSP_PORT:-1}/\n" > $who.ext
done
openssl x509 -req -in site.csr -CA ca.pem -CAkey ca.key -set_serial 4097 -out site.pem -days 2 -extfile site.ext 2>/dev/null
openssl x509 -req -in other.csr -CA ca.pem -CAkey ca.key -set_serial 4098 -out other.pem -days 2 -extfile other.ext 2>/dev/null
cat site.pem ca.pem > site-chain.pem
cat other.pem ca.pem > other-chain.pem
# A responder certificate for delegated signing.
openssl req -newkey rsa:2048 -nodes -keyout responder.key -out responder.csr -subj /CN=site-ocsp 2>/dev/null
printf "extendedKeyUsage=OCSPSigning\n" > responder.ext
openssl x509 -req -in responder.csr -CA ca.pem -CAkey ca.key -set_serial 4099 -out responder.pem -days 2 -extfile responder.ext 2>/dev/null
# The CA's database: both valid.
printf "[ca]\ndefault_ca=d\n[d]\ndatabase=index.txt\ndefault_md=sha256\nunique_subject=no\n" > ca.cnf
: > index.txt
for who in site other; do
  openssl ca -config ca.cnf -keyfile ca.key -cert ca.pem -valid $who.pem 2>/dev/null
done
respond() { # $1: leaf, $2: out, then more `openssl ocsp` responder options
  leaf=$1 out=$2; shift 2
  openssl ocsp -issuer ca.pem -cert $leaf.pem -reqout $out.req -no_nonce 2>/dev/null
  openssl ocsp -index index.txt -CA ca.pem -reqin $out.req -respout $out "$@" 2>/dev/null
}
respond site site-good.der -rsigner ca.pem -rkey ca.key -ndays 1
respond other other-good.der -rsigner ca.pem -rkey ca.key -ndays 1
respond site site-short.der -rsigner ca.pem -rkey ca.key -nmin 2
respond site site-delegated.der -rsigner responder.pem -rkey responder.key -ndays 1
cp index.txt index-valid.txt
openssl ca -config ca.cnf -keyfile ca.key -cert ca.pem -revoke site.pem 2>/dev/null
respond site site-revoked.der -rsigner ca.pem -rkey ca.key -ndays 1
cp index-valid.txt index.txt
