"""Objectives and samplers for the diffusion transformers.

* :class:`FlowMatching` (SiT): the linear interpolant ``x_t = t·x_data + (1 − t)·noise`` (t = 0 noise, t = 1 data)
  and velocity regression ``v = x_data − noise``; samplers: Euler and Heun ODE, Euler–Maruyama SDE.
* :class:`GaussianDiffusion` (DiT): DDPM with the 1000-step linear β schedule and ε-prediction, plus the learned
  variance term (improved DDPM's hybrid loss) when the model predicts σ; samplers: DDPM ancestral and DDIM, both on
  any evenly spaced subset of the 1000 steps.

Every sampler takes a ``guidance`` scale for classifier-free guidance on all predicted channels, a
``torch.Generator`` (deterministic under a seed) and shows a progress bar. The model is called as
``model(x, t, y)`` with t in the objective's time units (flow: 1000·t; DDPM: the integer step).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["FlowMatching", "GaussianDiffusion", "make_objective", "guided"]

Model = Callable[[Tensor, Tensor, Tensor], Tensor]


def guided(model: nn.Module, scale: float) -> Model:
    """The model with classifier-free guidance at ``scale`` (1 = the conditional prediction, no extra pass)."""
    if scale == 1.0:
        return model
    return lambda x, t, y: model.forward_with_cfg(x, t, y, scale)


def _steps_bar(n: int, progress: bool, desc: str):
    from tqdm.auto import trange

    return trange(n, disable=not progress, desc=desc, leave=False)


class FlowMatching:
    """SiT's flow matching with the linear interpolant and velocity prediction."""

    name = "flow"
    time_scale = 1000.0  # t ∈ [0, 1] is shown to the timestep embedder as 1000·t

    def loss(self, model: nn.Module, x1: Tensor, y: Tensor, generator: Optional[torch.Generator] = None) -> Tensor:
        B = x1.shape[0]
        t = torch.rand(B, device=x1.device, generator=generator)
        x0 = torch.randn(x1.shape, device=x1.device, generator=generator, dtype=x1.dtype)
        tb = t.view(B, 1, 1, 1).to(x1.dtype)
        xt = tb * x1 + (1 - tb) * x0
        v = model(xt, t * self.time_scale, y)[:, : x1.shape[1]]
        return F.mse_loss(v.float(), (x1 - x0).float())

    def velocity(self, model: Model, x: Tensor, t: float, y: Tensor) -> Tensor:
        tt = torch.full((x.shape[0],), t * self.time_scale, device=x.device)
        return model(x, tt, y)[:, : x.shape[1]]

    @torch.no_grad()
    def sample(self, model: nn.Module, y: Tensor, shape: tuple, steps: int = 50, sampler: str = "heun",
               guidance: float = 1.0, generator: Optional[torch.Generator] = None, progress: bool = False,
               noise: Optional[Tensor] = None) -> Tensor:
        """Integrate from noise (t = 0) to data (t = 1) with ``steps`` uniform steps.

        sampler: "euler" or "heun" (ODE), or "sde" (Euler–Maruyama with diffusion w(t) = 1 − t; the last step is
        deterministic, where the score's 1/(1 − t) would blow up).
        """
        if sampler not in ("euler", "heun", "sde"):
            raise ValueError(f"flow sampler must be 'euler', 'heun' or 'sde', got {sampler!r}")
        if steps < 1:
            raise ValueError(f"steps must be ≥ 1, got {steps}")
        f = guided(model, guidance)
        x = noise if noise is not None else torch.randn(shape, generator=generator, device=y.device)
        ts = torch.linspace(0.0, 1.0, steps + 1).tolist()
        for i in _steps_bar(steps, progress, f"flow {sampler}"):
            t, t_next = ts[i], ts[i + 1]
            h = t_next - t
            v = self.velocity(f, x, t, y)
            if sampler == "euler" or (sampler == "sde" and i == steps - 1):
                x = x + h * v
            elif sampler == "heun":
                x_e = x + h * v
                x = x + 0.5 * h * (v + self.velocity(f, x_e, t_next, y))
            else:
                # score of the Gaussian path: s = −E[noise | x_t] / (1 − t) = −(x − t·v) / (1 − t)
                score = -(x - t * v) / (1.0 - t)
                w = 1.0 - t
                x = x + h * (v + 0.5 * w * score) + math.sqrt(w * h) * torch.randn(x.shape, generator=generator,
                                                                                     device=x.device)
        return x


def _extract(a: Tensor, t: Tensor, x: Tensor) -> Tensor:
    return a.to(x.device)[t].to(x.dtype).view(-1, *([1] * (x.dim() - 1)))


def _normal_kl(mean1: Tensor, logvar1: Tensor, mean2: Tensor, logvar2: Tensor) -> Tensor:
    return 0.5 * (-1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2) + (mean1 - mean2) ** 2 * torch.exp(-logvar2))


def _approx_std_normal_cdf(x: Tensor) -> Tensor:
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _discretized_gaussian_nll(x: Tensor, mean: Tensor, log_scale: Tensor) -> Tensor:
    """−log p(x) of data quantised to 256 levels in [-1, 1] under N(mean, exp(log_scale)²) (improved DDPM)."""
    centered = x - mean
    inv = torch.exp(-log_scale)
    cdf_plus = _approx_std_normal_cdf(inv * (centered + 1.0 / 255.0))
    cdf_min = _approx_std_normal_cdf(inv * (centered - 1.0 / 255.0))
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
    log_delta = torch.log((cdf_plus - cdf_min).clamp(min=1e-12))
    log_probs = torch.where(x < -0.999, log_cdf_plus, torch.where(x > 0.999, log_one_minus_cdf_min, log_delta))
    return -log_probs


class GaussianDiffusion:
    """DDPM with the linear β schedule (1e-4 → 0.02 over 1000 steps) and ε-prediction."""

    name = "ddpm"

    def __init__(self, num_timesteps: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02,
                 learn_sigma: bool = False) -> None:
        self.T = num_timesteps
        self.learn_sigma = learn_sigma
        self.betas = torch.linspace(beta_start, beta_end, num_timesteps, dtype=torch.float64)
        self._set(self.betas)

    def _set(self, betas: Tensor) -> None:
        alphas = 1.0 - betas
        ac = torch.cumprod(alphas, 0)
        ac_prev = torch.cat([torch.ones(1, dtype=torch.float64), ac[:-1]])
        self.alphas_cumprod, self.alphas_cumprod_prev = ac, ac_prev
        self.posterior_variance = betas * (1.0 - ac_prev) / (1.0 - ac)
        # the first posterior variance is 0: clip the log, as improved DDPM does
        pv = self.posterior_variance
        self.posterior_log_variance = torch.log(torch.cat([pv[1:2], pv[1:]]))
        self.posterior_mean_coef1 = betas * torch.sqrt(ac_prev) / (1.0 - ac)
        self.posterior_mean_coef2 = (1.0 - ac_prev) * torch.sqrt(alphas) / (1.0 - ac)
        self.log_betas = torch.log(betas)

    def q_sample(self, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        ac = self.alphas_cumprod
        return _extract(ac.sqrt(), t, x0) * x0 + _extract((1 - ac).sqrt(), t, x0) * noise

    def _split(self, out: Tensor, C: int) -> tuple:
        eps = out[:, :C]
        v = out[:, C:2 * C] if self.learn_sigma else None
        return eps, v

    def _p_mean_logvar(self, eps: Tensor, v: Optional[Tensor], x: Tensor, idx: Tensor) -> tuple:
        """Mean and log-variance of p(x_{t−1} | x_t); ``idx`` indexes this process's (possibly respaced) tables."""
        ac = self.alphas_cumprod
        x0 = (x - _extract((1 - ac).sqrt(), idx, x) * eps) / _extract(ac.sqrt(), idx, x)
        mean = _extract(self.posterior_mean_coef1, idx, x) * x0 + _extract(self.posterior_mean_coef2, idx, x) * x
        if v is None:
            logvar = _extract(self.posterior_log_variance, idx, x).expand_as(x)
        else:  # learned interpolation between β̃_t and β_t (improved DDPM)
            frac = (v + 1) / 2
            logvar = frac * _extract(self.log_betas, idx, x) + (1 - frac) * _extract(self.posterior_log_variance, idx,
                                                                                     x)
        return mean, logvar, x0

    def loss(self, model: nn.Module, x0: Tensor, y: Tensor, generator: Optional[torch.Generator] = None) -> Tensor:
        B, C = x0.shape[:2]
        t = torch.randint(0, self.T, (B,), device=x0.device, generator=generator)
        noise = torch.randn(x0.shape, device=x0.device, generator=generator, dtype=x0.dtype)
        xt = self.q_sample(x0, t, noise)
        out = model(xt, t.float(), y)
        eps, v = self._split(out.float(), C)
        loss = F.mse_loss(eps, noise.float())
        if v is None:
            return loss
        # variational bound on the variance only (the mean's gradient comes from the MSE), in bits per dimension
        mean, logvar, _ = self._p_mean_logvar(eps.detach(), v, xt.float(), t)
        x0f = x0.float()
        true_mean = _extract(self.posterior_mean_coef1, t, x0f) * x0f + _extract(self.posterior_mean_coef2, t, x0f) * xt
        true_logvar = _extract(self.posterior_log_variance, t, x0f)
        kl = _normal_kl(true_mean, true_logvar, mean, logvar).mean(dim=(1, 2, 3)) / math.log(2.0)
        nll = _discretized_gaussian_nll(x0f, mean, 0.5 * logvar).mean(dim=(1, 2, 3)) / math.log(2.0)
        vb = torch.where(t == 0, nll, kl)
        return loss + vb.mean()

    def _respaced(self, steps: int) -> tuple:
        """An evenly spaced subset of the timesteps and its own β sequence (improved DDPM's respacing)."""
        if not 1 <= steps <= self.T:
            raise ValueError(f"steps must be in [1, {self.T}], got {steps}")
        use = torch.linspace(0, self.T - 1, steps).round().long().unique()
        ac = self.alphas_cumprod[use]
        prev = torch.cat([torch.ones(1, dtype=torch.float64), ac[:-1]])
        betas = 1.0 - ac / prev
        sub = GaussianDiffusion.__new__(GaussianDiffusion)
        sub.T, sub.learn_sigma, sub.betas = len(use), self.learn_sigma, betas
        sub._set(betas)
        return use, sub

    @torch.no_grad()
    def sample(self, model: nn.Module, y: Tensor, shape: tuple, steps: int = 250, sampler: str = "ddpm",
               guidance: float = 1.0, generator: Optional[torch.Generator] = None, progress: bool = False,
               noise: Optional[Tensor] = None, eta: float = 0.0) -> Tensor:
        """Ancestral DDPM or DDIM (``eta`` = 0: deterministic) sampling over ``steps`` evenly spaced timesteps."""
        if sampler not in ("ddpm", "ddim"):
            raise ValueError(f"diffusion sampler must be 'ddpm' or 'ddim', got {sampler!r}")
        use, sub = self._respaced(steps)
        f = guided(model, guidance)
        x = noise if noise is not None else torch.randn(shape, generator=generator, device=y.device)
        C = shape[1]
        n = len(use)
        for j in _steps_bar(n, progress, sampler):
            i = n - 1 - j
            idx = torch.full((shape[0],), i, dtype=torch.long, device=x.device)
            t = torch.full((shape[0],), float(use[i]), device=x.device)
            eps, v = self._split(f(x, t, y).float(), C)
            if sampler == "ddpm":
                mean, logvar, _ = sub._p_mean_logvar(eps, v, x, idx)
                z = torch.randn(x.shape, generator=generator, device=x.device) if i > 0 else torch.zeros_like(x)
                x = mean + torch.exp(0.5 * logvar) * z
            else:
                ac = float(sub.alphas_cumprod[i])
                ac_prev = float(sub.alphas_cumprod_prev[i])
                x0 = (x - math.sqrt(1 - ac) * eps) / math.sqrt(ac)
                sigma = eta * math.sqrt((1 - ac_prev) / (1 - ac) * (1 - ac / ac_prev))
                x = math.sqrt(ac_prev) * x0 + math.sqrt(max(1 - ac_prev - sigma**2, 0.0)) * eps
                if sigma > 0 and i > 0:
                    x = x + sigma * torch.randn(x.shape, generator=generator, device=x.device)
        return x


def make_objective(name: str, learn_sigma: bool = False):
    """"flow" (SiT) or "ddpm" (DiT)."""
    if name == "flow":
        if learn_sigma:
            raise ValueError("flow matching predicts a velocity: use a model with learn_sigma=False")
        return FlowMatching()
    if name == "ddpm":
        return GaussianDiffusion(learn_sigma=learn_sigma)
    raise ValueError(f"objective must be 'flow' or 'ddpm', got {name!r}")
