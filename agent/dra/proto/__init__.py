"""The kubelet's DRA plugin gRPC API (dra/v1 and dra/v1beta1, the same messages) and its plugin
registration API (pluginregistration/v1): the upstream .proto files and the Python stubs generated
from them by `make protos` (`agent/protogen.py`). Do not edit the stubs."""
