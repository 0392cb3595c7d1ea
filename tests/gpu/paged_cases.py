"""Paged K/V pools for the GPU tests of the families that read one (sdpa_decode, the attention entry point).

A pool in NHD [pages, page_size, H_kv, D] or HND [pages, H_kv, page_size, D] whose page ids are a random
permutation of the pool (a sequence's pages are not contiguous, and the pool holds `extra_pages` more than
the sequences use), and a page table [B, max_pages] (int32; its row stride may be padded). Entries past a
sequence's pages hold `pad_entry`: -1, or "spare" for the id of a page no sequence owns.
"""
from __future__ import annotations

import math

import torch

from prefill_cases import DT


class PagedCache:
    """A K/V pool in NHD or HND with a shuffled page table (pages of a sequence are not contiguous)."""

    def __init__(self, lengths, page, H_kv, D, dtype, layout, gen, extra_pages=7, pt_batch_stride=None,
                 pt_pad_cols=0, pad_entry=-1):
        self.lengths, self.page, self.layout = list(lengths), page, layout
        self.need = [math.ceil(L / page) for L in lengths]
        self.max_pages = max(1, max(self.need))
        total = sum(self.need) + extra_pages
        shape = (total, page, H_kv, D) if layout == "NHD" else (total, H_kv, page, D)
        self.k = torch.randn(shape, dtype=DT[dtype], device="cuda", generator=gen)
        self.v = torch.randn(shape, dtype=DT[dtype], device="cuda", generator=gen)
        perm = torch.randperm(total, device="cuda", generator=gen).to(torch.int32)
        self.unused = perm[sum(self.need):].tolist()  # pages no sequence owns
        if pad_entry == "spare":
            if not self.unused:
                raise ValueError("pad_entry='spare' needs extra_pages >= 1")
            pad_entry = self.unused[0]
        self.pad_entry = pad_entry
        B = len(lengths)
        if pt_batch_stride is None:  # a row stride of max_pages + pt_pad_cols
            self._pt_buf = torch.empty(B, self.max_pages + pt_pad_cols, dtype=torch.int32, device="cuda")
            self.page_table = self._pt_buf[:, :self.max_pages]
        else:  # a page table whose batch stride exceeds 2^31 elements
            self._pt_buf = torch.empty(pt_batch_stride * (B - 1) + self.max_pages, dtype=torch.int32, device="cuda")
            self.page_table = self._pt_buf.as_strided((B, self.max_pages), (pt_batch_stride, 1))
        self.page_table.fill_(pad_entry)
        pos = 0
        for b, n in enumerate(self.need):
            self.page_table[b, :n] = perm[pos:pos + n]
            pos += n
        self.seqlens = torch.tensor(self.lengths, dtype=torch.int32, device="cuda")

    def tokens(self, x):
        """A pool as [pages, page_size, H_kv, D] (a view: writes reach the pool)."""
        return x if self.layout == "NHD" else x.transpose(1, 2)

    def dense(self, b, length=None):
        """Sequence b's first `length` (default: its length) keys and values, [length, H_kv, D]."""
        L, P = self.lengths[b] if length is None else length, self.page
        pages = self.page_table[b, : math.ceil(L / P)].long()
        k, v = self.tokens(self.k)[pages], self.tokens(self.v)[pages]  # [n, P, H, D]
        H, D = k.shape[2], k.shape[3]
        return k.reshape(-1, H, D)[:L], v.reshape(-1, H, D)[:L]

    def poison(self, value, *, tails=True, unused=True):
        """Write `value` into K and V where no sequence's keys are: the slots of each sequence's pages past
        its length (tails: what a kernel reading its last page whole sees there) and the pages no sequence
        owns (unused)."""
        for x in (self.tokens(self.k), self.tokens(self.v)):
            if unused and self.unused:
                x[torch.tensor(self.unused, device="cuda").long()] = value
            if tails:
                for b, (L, n) in enumerate(zip(self.lengths, self.need)):
                    for p in range(L // self.page, n):
                        x[int(self.page_table[b, p]), L - p * self.page if p == L // self.page else 0:] = value


def pools_after_write(pools, news, slots, layout):
    """The pools' bits after a KV write, by torch: news[i] ([tokens, H_kv, D], in the bit dtype the pools are
    viewed as: int16 for 16-bit pools, uint8 for e4m3) scattered into a copy of pools[i] at the int64 slots
    (page * page_size + offset); slots outside the pools skip."""
    page = pools[0].shape[1] if layout == "NHD" else pools[0].shape[2]
    num_slots = pools[0].shape[0] * page
    s = slots.long()
    rows = torch.nonzero((s >= 0) & (s < num_slots)).flatten()
    pg, off = s[rows] // page, s[rows] % page
    want = []
    for pool, new in zip(pools, news):
        w = pool.clone().view(new.dtype)
        src = new[rows]
        if layout == "NHD":
            w.index_put_((pg, off), src)
        else:
            w.index_put_((pg[:, None], torch.arange(w.shape[1], device=w.device)[None, :], off[:, None]), src)
        want.append(w)
    return want


def decode_reference(q, k, v, scale, dtype=torch.float32):
    """Attention of q [S_q, H_q, D] over k/v [S_kv, H_kv, D] in `dtype` (fp32, or fp64), causal bottom-right
    (query i sees keys j <= S_kv - S_q + i): O [S_q, H_q, D], LSE [H_q, S_q] (a row with no key: -inf)."""
    S_q, H_q, D = q.shape
    S_kv, H_kv, _ = k.shape
    rep = H_q // H_kv
    qf = q.to(dtype).transpose(0, 1)
    kf = k.to(dtype).repeat_interleave(rep, 1).transpose(0, 1)
    vf = v.to(dtype).repeat_interleave(rep, 1).transpose(0, 1)
    s = torch.matmul(qf, kf.transpose(1, 2)) * scale
    i = torch.arange(S_q, device=q.device)[:, None]
    j = torch.arange(S_kv, device=q.device)[None, :]
    s = s.masked_fill(j > i + (S_kv - S_q), -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    return torch.matmul(p, vf).transpose(0, 1), lse
