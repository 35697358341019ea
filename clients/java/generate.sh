#!/usr/bin/env bash
# Generates the Java stubs of protos/ (plus third_party's google.rpc and grpc.health protos) into
# clients/java/gen, compiles them with src/MotorClient.java into clients/java/build, and writes the
# launcher clients/java/motor-client. Debian's packages only, no Maven: default-jdk-headless,
# protobuf-compiler, protobuf-compiler-grpc-java-plugin (grpc_java_plugin), libgrpc-java,
# libprotobuf-java, libnetty-java, libperfmark-java, libgoogle-gson-java, libgeronimo-annotation-1.3-spec-java
# (jars in /usr/share/java), and for TLS libnetty-tcnative-java + libnetty-tcnative-jni (OpenSSL: Debian's
# netty has no JDK ALPN negotiator, and gRPC over TLS needs ALPN).
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(cd ../.. && pwd)
JARS=/usr/share/java
# grpc-java 1.41's runtime: api, core, stub, protobuf + netty transport, and what they load.
CLASSPATH=$(printf "$JARS/%s.jar:" grpc-api grpc-context grpc-core grpc-stub grpc-protobuf \
  grpc-protobuf-lite grpc-netty protobuf \
  netty-buffer netty-codec netty-codec-http netty-codec-http2 netty-codec-socks netty-common netty-handler \
  netty-handler-proxy netty-resolver netty-transport netty-tcnative perfmark-api guava gson jsr305)
rm -rf gen build && mkdir -p gen build
protoc -I "$ROOT/protos" -I "$ROOT/third_party/googleapis" -I "$ROOT/third_party" \
  --java_out=gen --grpc-java_out=gen --plugin=protoc-gen-grpc-java="$(command -v grpc_java_plugin)" \
  $(cd "$ROOT/protos" && find motor -name '*.proto' | sort) \
  google/rpc/status.proto google/rpc/error_details.proto grpc/health/v1/health.proto
# grpc_java_plugin 1.41 marks its classes @javax.annotation.Generated, gone from the JDK since 11:
# the geronimo annotation spec jar supplies it to javac (source retention: not needed at run time).
javac -nowarn -d build -cp "$CLASSPATH:$JARS/geronimo-annotation-1.3-spec.jar" $(find gen src -name '*.java')
# netty looks for libnetty_tcnative.so and checks the file's own name, so a copy (not a link) of
# Debian's libnetty-tcnative.so
mkdir -p build/native
cp "$(ls /usr/lib/*/jni/libnetty-tcnative.so | head -1)" build/native/libnetty_tcnative.so
cat > motor-client <<LAUNCH
#!/bin/sh
exec java -Djava.library.path="$PWD/build/native" -cp "$PWD/build:$CLASSPATH" MotorClient "\$@"
LAUNCH
chmod +x motor-client
echo "built clients/java/motor-client"
