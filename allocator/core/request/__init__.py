"""A pod's request as the core sees it: the parsed `PodRequest` and the pod's recorded usage."""
