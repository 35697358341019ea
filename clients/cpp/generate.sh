#!/usr/bin/env bash
# Generates the C++ stubs of protos/ (plus third_party's google.rpc and grpc.health protos) into
# clients/cpp/gen and builds clients/cpp/motor-client with g++. Debian's packages only:
# g++, pkg-config, protobuf-compiler, libprotobuf-dev, libgrpc++-dev, protobuf-compiler-grpc
# (grpc_cpp_plugin).
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(cd ../.. && pwd)
rm -rf gen && mkdir -p gen
protos="$(cd "$ROOT/protos" && find motor -name '*.proto' | sort)"
rpc="google/rpc/status.proto google/rpc/error_details.proto"
# shellcheck disable=SC2086
protoc -I "$ROOT/protos" -I "$ROOT/third_party/googleapis" -I "$ROOT/third_party" \
  --cpp_out=gen --grpc_out=gen --plugin=protoc-gen-grpc="$(command -v grpc_cpp_plugin)" \
  $protos $rpc grpc/health/v1/health.proto
# one g++ per file, as many at once as there are cores; then link
flags="-std=c++17 -O0 -I gen $(pkg-config --cflags grpc++ protobuf)"
export flags
# shellcheck disable=SC2016
printf '%s\n' motor_client.cc $(find gen -name '*.cc' | sort) \
  | xargs -P "$(nproc)" -I{} sh -c 'g++ $flags -c "$1" -o "$1.o"' _ {}
# shellcheck disable=SC2046
g++ -o motor-client motor_client.cc.o $(find gen -name '*.cc.o' | sort) $(pkg-config --libs grpc++ protobuf)
rm -f motor_client.cc.o
echo "built clients/cpp/motor-client"
