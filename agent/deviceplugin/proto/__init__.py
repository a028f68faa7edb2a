"""The kubelet's gRPC APIs (device plugin v1beta1, PodResources v1): the upstream .proto files and
the Python stubs generated from them by `make protos` (`agent/protogen.py`). Do not edit the stubs."""
