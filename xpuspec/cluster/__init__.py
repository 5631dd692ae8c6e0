"""xpuspec on a Ray cluster: engine replicas behind one ingress, routed by prefix affinity.

Needs the ``cluster`` extra (Ray Serve). ``application.build_app`` is the Serve application;
docs/cluster.md describes the design, the commands and the measurements.
"""
