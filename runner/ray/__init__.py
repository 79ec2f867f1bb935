"""The runner's Ray side (`run --ray`, requirements-scale.txt): the cluster (cluster.py, boot.py), the pool of warm
workers (pool.py, worker.py), jobs over it (dispatch.py) and video workflows in time chunks (workflow_chunks.py,
workflow_video.py, video_chunks.py, chunk_node.py). Importing these modules needs no Ray."""
