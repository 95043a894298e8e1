"""The kube-scheduler extender: places each pod by its own policy before it is bound
(``numalign extender``). :mod:`.decide` is the pure decision; the rest serves it over
HTTP and keeps its view of the fleet."""
