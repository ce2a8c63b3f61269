#!/usr/bin/env bash
# Makes the files of the ztrain-auth Secret (deploy/k8s/base/kustomization.yaml): a random bearer token,
# a private CA (ca.crt; its key ca.key stays here and is not put in the Secret), a server certificate for
# the state servers' DNS names (tls.crt, tls.key) and a client certificate for the workers (client.crt,
# client.key), all signed by that CA.
#   deploy/k8s/make-secrets.sh [NAMESPACE] [DIR] [SERVERS]
#   defaults: ztrain, deploy/k8s/base/secrets, 16
# The server certificate names servers 0 to SERVERS-1 one by one (ztrain-server-<s>.ztrain-server, as
# the workers' --servers list has them: TLS libraries do not match a wildcard against such a short
# name), and any server by wildcard under <ns>.svc and <ns>.svc.cluster.local.
# Files that exist are kept, so running it again changes nothing; delete DIR's files to make new ones.
# Needs openssl. The files are secrets: DIR's .gitignore keeps them out of git.
set -euo pipefail
ns=${1:-ztrain}
dir=${2:-$(dirname "$0")/base/secrets}
servers=${3:-16}
case "$servers" in
  '' | *[!0-9]* | 0)
    echo "make-secrets: SERVERS='$servers' is not a positive whole number; give the most state servers you will run" >&2
    exit 2 ;;
esac
svc=ztrain-server
days=825

umask 077
mkdir -p "$dir"
cd "$dir"

if [ -s token ] && [ -s ca.crt ] && [ -s tls.crt ] && [ -s tls.key ] && [ -s client.crt ] && [ -s client.key ]; then
  echo "make-secrets: $PWD already holds every file; delete them to make new ones"
  exit 0
fi
if [ -e ca.key ] || [ -e ca.crt ]; then
  echo "make-secrets: $PWD holds part of the files only; delete token, ca.*, tls.*, client.* there and run again" >&2
  exit 1
fi

openssl rand -hex 32 | tr -d '\n' >token
openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -sha256 -days 3650 \
  -keyout ca.key -out ca.crt -subj "/CN=ztrain CA ($ns)" 2>/dev/null

# sign NAME SUBJECT EXTENSIONS: a P-256 key NAME.key and a certificate NAME.crt signed by the CA.
sign() {
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -sha256 \
    -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
  printf '%b' "$3" >"$1.ext"
  openssl x509 -req -sha256 -days "$days" -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -out "$1.crt" -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
sans="DNS:*.$svc.$ns.svc,DNS:*.$svc.$ns.svc.cluster.local,DNS:localhost,IP:127.0.0.1"
for s in $(seq 0 $((servers - 1))); do
  sans="$sans,DNS:$svc-$s.$svc,DNS:$svc-$s.$svc.$ns"
done
sign tls "/CN=$svc" "subjectAltName=$sans\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n"
sign client "/CN=ztrain-worker" "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature\n"
rm -f ca.srl
echo "make-secrets: wrote token, ca.crt, tls.crt, tls.key, client.crt, client.key (and ca.key) to $PWD"
