"""What the node tells the cluster: the Device CR, the partition table, the Node's labels and resources."""
