#!/bin/sh
# Makes a client CA, clients alice (valid), bob (revoked: in ca.crl) and mallory (signed by
# another CA), in the current folder, for the mTLS tests.
set -e
ec="-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes"
openssl req -x509 $ec -keyout ca.key -out ca.pem -days 2 -subj /CN=clients-ca 2>/dev/null
openssl req -x509 $ec -keyout other-ca.key -out other-ca.pem -days 2 -subj /CN=other-ca 2>/dev/null
for who in alice bob mallory; do
  openssl req $ec -keyout $who.key -out $who.csr -subj "/O=Example/CN=$who" 2>/dev/null
  printf "subjectAltName=DNS:$who.example\n" > $who.ext
done
openssl x509 -req -in alice.csr -CA ca.pem -CAkey ca.key -set_serial 1 -out alice.pem -days 2 -extfile alice.ext 2>/dev/null
openssl x509 -req -in bob.csr -CA ca.pem -CAkey ca.key -set_serial 2 -out bob.pem -days 2 -extfile bob.ext 2>/dev/null
openssl x509 -req -in mallory.csr -CA other-ca.pem -CAkey other-ca.key -set_serial 3 -out mallory.pem -days 2 -extfile mallory.ext 2>/dev/null
printf "[ca]\ndefault_ca=d\n[d]\ndatabase=index.txt\ncrlnumber=crlnumber\ndefault_md=sha256\ndefault_crl_days=2\n" > ca.cnf
: > index.txt; echo 01 > crlnumber
openssl ca -config ca.cnf -keyfile ca.key -cert ca.pem -revoke bob.pem 2>/dev/null
openssl ca -config ca.cnf -keyfile ca.key -cert ca.pem -gencrl -out ca.crl 2>/dev/null
