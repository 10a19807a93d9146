"""The patched vLLM engine on a GPU: identity to stock, and step time against it.

One vLLM engine per worker process (worker.py), driven over a pipe
(client.py): the arms (arms.py) differ in which vLLM copy and which
environment a process gets, so only separate processes can hold them.
model.py is the model they all serve.
"""
