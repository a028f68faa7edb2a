"""kube-scheduler extender verbs: one module per verb."""
