"""Image inputs: what a prompt's images become before they reach the engine.

The API process decodes each image (``image_loading.py``), runs the model's
image processor on it and widens the prompt's image token into the rows the
model's image embeddings fill (``processor.py``); the engine receives token ids
and ``ImageFeature``s (``core/image_features.py``: pixel values as bytes, the placeholder
span, a content hash that keys the prefix cache). The runner turns the
features into embedding rows when a step first computes their span
(``runtime/image_embeddings.py``).
"""
