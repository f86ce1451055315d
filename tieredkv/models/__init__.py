"""Models: loading (embedded, tiny test models, local directories, hub ids, models in memory), fingerprints,
text codecs.

    loading.py            load_model, LoadedModel (and LoadedModel.from_hf), the model fingerprint and the
                          embedded model's converted copy
    hub.py                hub ids (ORG/NAME) found in the local Hugging Face cache, never downloaded
    fingerprint_cache.py  a local directory's fingerprint cached by file identity
    text_codec.py         encode/decode and the chat frame, for HF tokenizers and the byte tokenizer
"""
