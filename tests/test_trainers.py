"""thunderfn inside the trainers people use (docs/integrations.md): a jitted module presents its module's forward
(signature, name, docstring: what the Hugging Face Trainer and Lightning read), a module holding a jitted one saves
and loads its state dict as eager's does, and real runs of transformers.Trainer, Lightning Fabric and
lightning.Trainer train, evaluate, save and resume exactly as they do on the eager model."""
import copy
import gc
import inspect
import io
import os
import weakref

import pytest
import torch

import thunderfn as tf
from thunderfn.module import ThunderModule


class Scorer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, features, labels=None, *, scale: float = 1.0):
        """Scores, and the loss against labels where given."""
        score = self.linear(features) * scale
        return score if labels is None else torch.nn.functional.mse_loss(score, labels)


# -- a jitted module presents its module's forward ---------------------------------------------------------
def test_a_jitted_modules_forward_has_its_modules_signature_name_and_docstring():
    scorer = Scorer()
    jitted = tf.jit(scorer)
    assert inspect.signature(jitted.forward) == inspect.signature(scorer.forward)
    assert jitted.forward.__name__ == "forward" and jitted.forward.__doc__ == Scorer.forward.__doc__
    # what the Hugging Face Trainer reads to find a model's label arguments: its class's forward
    assert list(inspect.signature(type(jitted).forward).parameters) == ["self", "features", "labels", "scale"]
    assert isinstance(jitted, ThunderModule) and not isinstance(jitted, Scorer)
    x, y = torch.randn(3, 4), torch.randn(3, 1)
    torch.testing.assert_close(jitted.forward(x, y, scale=2.0), scorer(x, y, scale=2.0))
    torch.testing.assert_close(type(jitted).forward(jitted, x), scorer(x))


def test_a_jitted_module_is_freed_without_the_cyclic_collector_and_copies_and_pickles_as_its_class():
    jitted = tf.jit(Scorer())
    x = torch.randn(2, 4)
    expected = jitted(x)
    copied = copy.deepcopy(jitted)
    buffer = io.BytesIO()
    torch.save(jitted, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for other in (copied, loaded):
        assert type(other) is type(jitted)
        torch.testing.assert_close(other(x), expected)
    alive = weakref.ref(jitted)
    gc.disable()
    try:
        del jitted
        assert alive() is None  # nothing it holds refers back to it (its forward is made per access)
    finally:
        gc.enable()


class Holder(torch.nn.Module):
    """A module holding a jitted one, as a LightningModule holds `self.net = tf.jit(net)`."""

    def __init__(self, jit=True):
        super().__init__()
        net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
        self.net = tf.jit(net) if jit else net
        self.head = torch.nn.Linear(3, 1)


def test_a_module_holding_a_jitted_module_saves_and_loads_its_state_dict_as_eager():
    state = {key: value + 1 for key, value in Holder(jit=False).state_dict().items()}
    jitted, eager = Holder(), Holder(jit=False)
    assert list(jitted.state_dict()) == list(state)
    assert str(jitted.load_state_dict(state)) == str(eager.load_state_dict(state))
    for key, value in jitted.state_dict().items():
        torch.testing.assert_close(value, state[key])

    # what a load reports is eager's, key for key: missing, unexpected, and shapes that do not fit
    damaged = {**state, "net.extra": torch.zeros(1)}
    del damaged["net.0.bias"]
    assert str(jitted.load_state_dict(damaged, strict=False)) == str(eager.load_state_dict(damaged, strict=False))
    damaged["net.0.bias"] = torch.zeros(5)
    messages = []
    for module in (jitted, eager):
        with pytest.raises(RuntimeError) as raised:
            module.load_state_dict(damaged)
        messages.append(str(raised.value))
    assert messages[0] == messages[1] and "size mismatch for net.0.bias" in messages[0]


# -- the Hugging Face Trainer --------------------------------------------------------------------------------
def _hf():
    transformers = pytest.importorskip("transformers", reason="the Trainer tests need Hugging Face transformers "
                                       "(pip install -e '.[test]' installs it)")
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate "
                                  "(pip install -e '.[test]' installs it)")
    transformers.logging.set_verbosity_error()
    return transformers


class _Rows(torch.utils.data.Dataset):
    """Token rows as dicts, with a column the model's forward does not name (the Trainer drops it)."""

    def __init__(self, n: int, seed: int):
        self.ids = torch.randint(0, 64, (n, 16), generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i], "row": i}


def _trainer_run(transformers, wrap, output_dir, *, tied=True, resume=None, **arguments):
    """(losses logged at each step, the evaluation loss, the parameters after) of 12 steps of transformers.Trainer
    on a tiny random GPT-2 given as wrap(model), with the Trainer's defaults but for its size, its logging, a
    checkpoint every 6 steps and `arguments`."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                                     tie_word_embeddings=tied, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(str(output_dir), max_steps=12, per_device_train_batch_size=4,
                                          per_device_eval_batch_size=4, learning_rate=1e-3, logging_steps=1,
                                          save_steps=6, report_to=[], use_cpu=True, seed=0, **arguments)
    trainer = transformers.Trainer(model=wrap(model), args=args, train_dataset=_Rows(48, 1), eval_dataset=_Rows(8, 2))
    trainer.train(resume_from_checkpoint=resume)
    evaluation = trainer.evaluate()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return losses, evaluation["eval_loss"], [p.detach().clone() for p in model.parameters()]


def _assert_same_run(run, eager):
    losses, eval_loss, parameters = run
    eager_losses, eager_eval_loss, eager_parameters = eager
    assert len(losses) == len(eager_losses) == 12
    torch.testing.assert_close(losses, eager_losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(eval_loss, eager_eval_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(parameters, eager_parameters, rtol=1e-5, atol=1e-6)


def _compiled_in_place(model):
    model.compile(backend="thunderfn")  # torch's nn.Module.compile: the model stays a PreTrainedModel
    return model


@pytest.mark.parametrize("wrap, tied", [(tf.jit, True), (tf.jit, False), (_compiled_in_place, True)],
                         ids=["tf.jit(model)", "tf.jit(model)-untied", "model.compile(backend='thunderfn')"])
def test_the_hugging_face_trainer_trains_evaluates_saves_and_resumes_as_on_the_eager_model(tmp_path, wrap, tied):
    transformers = _hf()
    eager = _trainer_run(transformers, lambda model: model, tmp_path / "eager", tied=tied)
    _assert_same_run(_trainer_run(transformers, wrap, tmp_path / "run", tied=tied), eager)
    assert {"checkpoint-6", "checkpoint-12"} <= set(os.listdir(tmp_path / "run"))
    # a new Trainer resumed from the step-6 checkpoint ends where the uninterrupted run did
    _, eval_loss, parameters = _trainer_run(transformers, wrap, tmp_path / "resumed", tied=tied,
                                            resume=str(tmp_path / "run" / "checkpoint-6"))
    torch.testing.assert_close(eval_loss, eager[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(parameters, eager[2], rtol=1e-5, atol=1e-6)


def test_a_jitted_hugging_face_model_is_an_instance_of_its_class_and_saves_as_one(tmp_path):
    """The Trainer saves a model it takes for a PreTrainedModel with save_pretrained (tied weights written once);
    any other as a bare state dict, which safetensors refuses with tied weights: so a jitted Hugging Face model
    is an instance of its class, while its type stays a ThunderModule."""
    transformers = _hf()
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16)
    model = transformers.GPT2LMHeadModel(config).eval()
    jitted = tf.jit(model)
    assert isinstance(jitted, transformers.PreTrainedModel) and isinstance(jitted, ThunderModule)
    assert jitted.__class__ is transformers.GPT2LMHeadModel and type(jitted) is not transformers.GPT2LMHeadModel
    jitted.save_pretrained(tmp_path)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 32, (2, 8))
    torch.testing.assert_close(jitted(ids).logits, loaded(ids).logits)


def test_the_hugging_face_trainers_mixed_precision_wraps_the_jitted_forward_as_the_eager_one(tmp_path):
    """bf16=True: accelerate sets an autocast wrapper of `model.forward` as the model's forward, which the
    jitted module's call must run (autocast on, traced as such), not bypass."""
    transformers = _hf()
    eager = _trainer_run(transformers, lambda model: model, tmp_path / "eager", save_strategy="no", bf16=True)
    _assert_same_run(_trainer_run(transformers, tf.jit, tmp_path / "run", save_strategy="no", bf16=True), eager)


def test_the_hugging_face_trainer_with_torch_compile_and_the_thunderfn_backend(tmp_path):
    """torch.compile's wrapper presents forward as (*args, **kwargs), for any backend: the Trainer then keeps no
    dataset column and finds no labels unless told (docs/integrations.md)."""
    transformers = _hf()
    eager = _trainer_run(transformers, lambda model: model, tmp_path / "eager", tied=False)
    run = _trainer_run(transformers, lambda model: torch.compile(model, backend="thunderfn"), tmp_path / "run",
                       tied=False, remove_unused_columns=False, label_names=["labels"])
    _assert_same_run(run, eager)


# -- Lightning -----------------------------------------------------------------------------------------------
def _lightning():
    return pytest.importorskip("lightning", reason="the Lightning tests need lightning "
                                             "(pip install -e '.[test]' installs it)")


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _regression_data():
    features = torch.randn(48, 8, generator=torch.Generator().manual_seed(1))
    targets = torch.randn(48, 1, generator=torch.Generator().manual_seed(2))
    return torch.utils.data.TensorDataset(features, targets)


@pytest.mark.parametrize("wrap", [tf.jit, lambda net: torch.compile(net, backend="thunderfn")],
                         ids=["tf.jit", "torch.compile-thunderfn"])
def test_lightning_fabric_trains_saves_and_loads_as_on_the_eager_model(tmp_path, wrap):
    L = _lightning()

    def run(wrap, folder):
        fabric = L.Fabric(accelerator="cpu", devices=1)
        net = _net()
        model, optimizer = fabric.setup(wrap(net), torch.optim.SGD(net.parameters(), lr=0.1))
        loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(_regression_data(), batch_size=4))
        losses = []
        for features, targets in loader:
            loss = torch.nn.functional.mse_loss(model(features), targets)
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        path = str(folder / "state.ckpt")
        fabric.save(path, {"model": model, "optimizer": optimizer})
        fresh = _net()
        with torch.no_grad():
            for p in fresh.parameters():
                p.zero_()
        fresh_model, fresh_optimizer = fabric.setup(wrap(fresh), torch.optim.SGD(fresh.parameters(), lr=0.1))
        fabric.load(path, {"model": fresh_model, "optimizer": fresh_optimizer})
        return losses, [p.detach().clone() for p in net.parameters()], [p.detach().clone() for p in fresh.parameters()]

    eager_losses, eager_parameters, _ = run(lambda net: net, tmp_path)
    losses, parameters, loaded = run(wrap, tmp_path)
    torch.testing.assert_close(losses, eager_losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(parameters, eager_parameters, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loaded, parameters, rtol=0, atol=0)


def test_a_lightning_module_holding_a_jitted_model_trains_saves_and_loads_as_eager(tmp_path):
    L = _lightning()

    class Regression(L.LightningModule):
        def __init__(self, jit: bool):
            super().__init__()
            self.save_hyperparameters()
            self.net = tf.jit(_net()) if jit else _net()

        def training_step(self, batch, index):
            features, targets = batch
            return torch.nn.functional.mse_loss(self.net(features), targets)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def run(jit: bool, folder):
        module = Regression(jit)
        trainer = L.Trainer(max_steps=12, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, enable_checkpointing=False, default_root_dir=str(folder))
        trainer.fit(module, torch.utils.data.DataLoader(_regression_data(), batch_size=4))
        path = str(folder / "final.ckpt")
        trainer.save_checkpoint(path)
        return module, Regression.load_from_checkpoint(path)

    eager, eager_loaded = run(False, tmp_path / "eager")
    jitted, jitted_loaded = run(True, tmp_path / "jitted")
    assert isinstance(jitted_loaded.net, ThunderModule)
    assert list(jitted.state_dict()) == list(eager.state_dict())
    for module in (jitted, jitted_loaded, eager_loaded):
        torch.testing.assert_close(list(module.parameters()), list(eager.parameters()), rtol=1e-5, atol=1e-6)
