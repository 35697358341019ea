"""Default ports of the Motor programs (each can be changed in its config or with --port)."""

GATEWAY_HTTP = 8000
COORDINATOR_GRPC = 9100
CONTROLLER_GRPC = 9200
NODEMANAGER_GRPC = 9300
