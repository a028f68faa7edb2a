"""topoalloc as a DRA driver on the node: ResourceSlices from the Device, the kubelet DRA plugin."""
