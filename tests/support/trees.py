"""Random trees of token rows: what the shared-prefix passes are tested on."""

import torch


def random_tree_rows(gen, prompts=2, depth=3, duplicate=True):
    """Rows of ``prompts`` trees: a prompt (2 to 7 tokens), then 1 to 3 branches of 1 to 6
    random tokens at each node, a branch ending the row at random before ``depth``; a
    row repeated whole (``duplicate``); right-padded with 0 past the longest row plus 0 to
    2 columns, shuffled. Returns (ids, lengths, prompt lengths)."""
    rows, prompt_lengths = [], []

    def randint(low, high):
        return int(torch.randint(low, high + 1, (1,), generator=gen))

    def grow(prefix, n, level):
        for _ in range(randint(1, 3)):
            row = torch.cat([prefix, torch.randint(3, 250, (randint(1, 6),), generator=gen)])
            if level == depth or randint(0, 3) == 0:
                rows.append(row)
                prompt_lengths.append(n)
            else:
                grow(row, n, level + 1)

    for _ in range(prompts):
        n = randint(2, 7)
        grow(torch.randint(3, 250, (n,), generator=gen), n, 1)
    if duplicate:
        rows.append(rows[0])
        prompt_lengths.append(prompt_lengths[0])
    return padded_in_random_order(rows, prompt_lengths, randint(0, 2), gen)


def padded_in_random_order(rows, prompt_lengths, extra, gen):
    """``rows`` (token tensors) right-padded with 0 to the longest plus ``extra`` columns,
    shuffled by ``gen``: (ids, lengths, prompt lengths)."""
    width = max(len(r) for r in rows) + extra
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
    order = torch.randperm(len(rows), generator=gen)
    lengths = torch.tensor([len(r) for r in rows])[order]
    return ids[order], lengths, torch.tensor(prompt_lengths)[order]
