"""KL controllers: the adaptive rule by hand and as a loop, state in Lightning checkpoints,
use as PPOLoss's kl_coef, bad arguments."""

import lightning as L
import pytest
import torch

from lightning_adv import AdaptiveKLController, FixedKLController, KLControllerConfig, PPOLoss


def test_fixed_controller_never_moves():
    ctl = FixedKLController(0.05)
    for kl in (0.0, 10.0, 1e-3):
        assert ctl.update(kl, n_steps=64) == 0.05
    assert ctl.value == 0.05


def test_adaptive_update_by_hand():
    ctl = AdaptiveKLController(kl_coef=0.1, target=6.0, horizon=10_000)
    # 12 / 6 - 1 = 1, clipped to 0.2: 0.1 * (1 + 0.2 * 256 / 10000)
    assert ctl.update(12.0, n_steps=256) == pytest.approx(0.1 * 1.00512, rel=1e-15)
    # 5.7 / 6 - 1 = -0.05: times (1 - 0.05 * 100 / 10000)
    assert ctl.update(torch.tensor(5.7, dtype=torch.float64), n_steps=100) == pytest.approx(0.1 * 1.00512 * 0.9995, rel=1e-14)
    # far below target: -1 clipped to -0.2
    assert ctl.update(0.0, n_steps=1000) == pytest.approx(0.1 * 1.00512 * 0.9995 * 0.98, rel=1e-14)


def test_the_old_and_verls_keyword_init_kl_coef_still_works_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match=r"init_kl_coef=.*deprecated; use kl_coef"):
        old = AdaptiveKLController(init_kl_coef=0.2, target=6.0, horizon=10000)
    new = AdaptiveKLController(kl_coef=0.2, target=6.0, horizon=10000)
    assert old.value == new.value == 0.2
    assert old.update(12.0, n_steps=256) == new.update(12.0, n_steps=256) == pytest.approx(
        0.2 * 1.00512, rel=1e-15)
    with pytest.raises(TypeError, match="both kl_coef and its deprecated name init_kl_coef"):
        AdaptiveKLController(0.1, 6.0, 100, init_kl_coef=0.2)
    with pytest.raises(TypeError, match=r"missing required argument\(s\) kl_coef, horizon"):
        AdaptiveKLController(target=6.0)


def test_adaptive_matches_a_loop_and_moves_towards_the_target():
    ctl = AdaptiveKLController(0.2, target=1.0, horizon=50)
    value, g = 0.2, torch.Generator().manual_seed(0)
    for _ in range(40):
        kl = float(torch.rand((), generator=g)) * 3
        value *= 1 + min(max(kl / 1.0 - 1, -0.2), 0.2) * 4 / 50
        assert ctl.update(kl, n_steps=4) == pytest.approx(value, rel=1e-12)
    above = AdaptiveKLController(0.2, target=1.0, horizon=50)
    below = AdaptiveKLController(0.2, target=1.0, horizon=50)
    assert above.update(2.0) > 0.2 > below.update(0.5)


class ControlledModule(L.LightningModule):
    """Updates its controller once per step with a KL that depends on the step."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.kl_controller = AdaptiveKLController(0.1, target=0.5, horizon=4)

    def training_step(self, batch, batch_idx):
        self.kl_controller.update(0.2 + 0.3 * self.global_step, n_steps=1)
        self.log("train/kl_coef", self.kl_controller.value)
        return (self.weight - 1) ** 2

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.zeros(8, 1), batch_size=1)


def fit(tmp_path, steps, ckpt_path=None) -> tuple[ControlledModule, L.Trainer]:
    module = ControlledModule()
    trainer = L.Trainer(max_steps=steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)
    trainer.fit(module, ckpt_path=ckpt_path)
    return module, trainer


def test_the_coefficient_is_saved_in_and_restored_from_a_lightning_checkpoint(tmp_path):
    straight, _ = fit(tmp_path, 4)
    first, trainer = fit(tmp_path, 2)
    assert first.kl_controller.value != 0.1
    path = tmp_path / "two_steps.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)["state_dict"]["kl_controller.kl_coef"]
    assert saved.item() == first.kl_controller.value
    restored = ControlledModule.load_from_checkpoint(path)
    assert restored.kl_controller.value == first.kl_controller.value
    resumed, _ = fit(tmp_path, 4, ckpt_path=path)
    assert resumed.kl_controller.value == straight.kl_controller.value


def test_ppo_loss_reads_the_controllers_current_value():
    ctl = AdaptiveKLController(0.1, target=0.01, horizon=10)
    loss = PPOLoss(kl_coef=ctl, kl_estimator="k1")
    lp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -2.0]])
    zero, mask = torch.zeros_like(lp), torch.ones_like(lp)
    before = loss(lp, lp, zero, mask, ref_logprobs=ref)["loss"].item()
    assert before == pytest.approx(0.1 * 0.25)
    ctl.update(1.0, n_steps=5)  # +20% * 5 / 10
    assert loss(lp, lp, zero, mask, ref_logprobs=ref)["loss"].item() == pytest.approx(0.11 * 0.25)
    assert "kl_coef.kl_coef" in loss.state_dict()


def test_a_state_dict_with_the_buffer_s_old_name_loads():
    # Checkpoints written before the buffer was named kl_coef hold it as "coef".
    ctl = AdaptiveKLController(0.1, target=1.0, horizon=10)
    ctl.load_state_dict({"coef": torch.tensor(0.3, dtype=torch.float64)})
    assert ctl.value == 0.3


def test_config_builds_the_controller():
    assert isinstance(KLControllerConfig().build(0.1), FixedKLController)
    ctl = KLControllerConfig(type="adaptive", target=6.0, horizon=10_000).build(0.2)
    assert isinstance(ctl, AdaptiveKLController) and ctl.value == 0.2 and ctl.target == 6.0


@pytest.mark.parametrize("make,name", [
    (lambda: FixedKLController(-0.1), "kl_coef"),
    (lambda: AdaptiveKLController(-1.0, 1.0, 1.0), "kl_coef"),
    (lambda: AdaptiveKLController(0.1, 0.0, 1.0), "target"),
    (lambda: AdaptiveKLController(0.1, 1.0, -5), "horizon"),
    (lambda: AdaptiveKLController(0.1, 1.0, 5).update(float("nan")), "current_kl"),
    (lambda: AdaptiveKLController(0.1, 1.0, 5).update(torch.ones(2)), "current_kl"),
    (lambda: AdaptiveKLController(0.1, 1.0, 5).update(1.0, n_steps=0), "n_steps"),
    (lambda: FixedKLController(0.1).update(1.0, n_steps=1.5), "n_steps"),
    (lambda: KLControllerConfig(type="pid"), "kl_controller.type"),
    (lambda: KLControllerConfig(type="adaptive", target=1.0), "kl_controller.horizon"),
    (lambda: KLControllerConfig(type="fixed", target=1.0), "kl_controller.target"),
    (lambda: PPOLoss(kl_coef=torch.nn.Linear(1, 1)), "kl_coef"),
])
def test_bad_arguments_name_the_argument(make, name):
    with pytest.raises(ValueError, match=name):
        make()
