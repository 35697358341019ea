#!/usr/bin/env bash
# Generates the Go stubs of protos/ into clients/go/gen and builds clients/go/motor-client.
# Debian's toolchain only, no module proxy: golang-go, protobuf-compiler, protoc-gen-go,
# protoc-gen-go-grpc, golang-google-grpc-dev, golang-google-genproto-dev (their sources live in
# /usr/share/gocode, used in GOPATH mode). The go_package options in protos/ name the import paths.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(cd ../.. && pwd)
rm -rf gen .gopath && mkdir -p gen .gopath/src
protoc -I "$ROOT/protos" \
  --go_out=gen --go_opt=module=motor/clients/go/gen \
  --go-grpc_out=gen --go-grpc_opt=module=motor/clients/go/gen \
  $(cd "$ROOT/protos" && find motor -name '*.proto' | sort)
# GOPATH mode: import "motor/clients/go/..." resolves to this repository.
ln -s "$ROOT" .gopath/src/motor
export GO111MODULE=off GOPATH="$PWD/.gopath:/usr/share/gocode" GOFLAGS= GOCACHE="${GOCACHE:-$PWD/.gocache}"
go build -o motor-client ./cmd/motor-client
echo "built clients/go/motor-client"
