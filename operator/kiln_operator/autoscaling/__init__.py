"""Kiln's autoscaling policy: the pure core of the SLO autoscaler.

Why it exists: the decision of how many replicas a service needs is the product's most
consequential logic, so it is written as pure functions (`now` is a parameter, no I/O, no
clock) that the operator's timer, the unit tests and the simulator all call unchanged.
Nothing in this package may import kopf, a Kubernetes client, an HTTP library or the clock.
"""
