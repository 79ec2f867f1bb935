"""The runner's Ray side (`run --ray`, requirements-scale.txt): the cluster and the pool of warm workers, jobs over it
(pool.py, boot.py) and video workflows in time chunks (workflow_chunks.py, workflow_video.py, chunk_node.py).
Importing these modules needs no Ray."""
