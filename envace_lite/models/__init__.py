"""Building a policy: loading a checkpoint or a profile's base model (``load``; hub models through
``hub``) and the from-scratch ``micro`` policy with its BPE tokenizer (``micro``)."""
