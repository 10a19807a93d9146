# Lands in the V2 runner's execute_model before its FULL graph replay,
# `self.cudagraph_manager.run_fullgraph(GRAPH)` (the reset design): a replay runs no
# Python forward, so the seeds its graph reads are drawn here. GRAPH is read off
# that call.

sr_seed_replay(GRAPH)
