"""Training recipes and transfer experiments built on the memory mechanism (:mod:`polymem.torch`) and the
pretrained models (:mod:`polymem.models`).

    from polymem.recipes.train import TrainConfig, train_donor
    train_donor("cl100k_base", ["corpus/"], "donor.pmem", cfg=TrainConfig(steps=600))
    from polymem.recipes.transfer import run_transfer
    result = run_transfer("donor.pmem", "mistral-v1", ["corpus/"])

Small models trained from scratch: ``model`` (a nanoGPT-style causal LM), ``train`` (data streams, the training
loop, bits per byte, ``train_donor``), ``transfer`` (a donor table in arms against controls, recipients trained
from scratch), ``curves`` (reading the arms' learning curves).
Pretrained, frozen backbones: ``frozen`` (a table and its site trained on a frozen backbone), ``pretrained`` (a
donor table on a pretrained recipient, in arms against controls).
Shared: ``data`` (reading a corpus into documents and the held-out split every recipe uses).

Importing this package loads nothing; each module loads torch when imported.
"""
