"""Models: loading (embedded, tiny test models, local directories), fingerprints, text codecs.

    loading.py     load_model, LoadedModel, the model fingerprint and converted-model cache
    text_codec.py  encode/decode and the chat frame, for HF tokenizers and the byte tokenizer
"""
