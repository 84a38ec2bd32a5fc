
/* $kernel: $note */
EVO_TASK(${fname}) {
    const ${kernel}_ctx *c = (const ${kernel}_ctx *)vctx;
    const evo_range *rg = &c->ranges[$range];
    int evo_zero = 0; /* 1: an integer divisor was 0 (evo_nz_*); 2: an index out of range (evo_pick) */
$bindings
    const int64_t wext = $w_extent;
    const int64_t ext = $inner_extent;
    int64_t first = (int64_t)task * rg->per;
    int64_t end = first + rg->per < rg->total ? first + rg->per : rg->total;
    const int64_t wblocks = (wext + 7) / 8;
    const int64_t jblocks = (ext + 7) / 8;
    const int64_t wchunks = (wblocks + EVO_TILE_CHUNK - 1) / EVO_TILE_CHUNK;
    for (int64_t r = first; r < end; ++r) {
        int64_t row = r / jblocks / wchunks;
        const int64_t wc = r / jblocks % wchunks;
        const int64_t jb = r % jblocks * 8;
        const int64_t jn = ext - jb < 8 ? ext - jb : 8;
        const int64_t wbend = (wc + 1) * EVO_TILE_CHUNK < wblocks ? (wc + 1) * EVO_TILE_CHUNK : wblocks;
$unravel
        for (int64_t wbk = wc * EVO_TILE_CHUNK; wbk < wbend; ++wbk) {
            const int64_t w0 = wbk * 8;
            const int64_t wn = wext - w0 < 8 ? wext - w0 : 8;
$row_loop
            if (wn == 8 && jn == 8) {
                $ctype tile[8][8], rows[8][8];
                for (int64_t jj = 0; jj < 8; ++jj) {
                    for (int64_t ww = 0; ww < 8; ++ww) {
                        const int64_t w = w0 + ww;
                        const int64_t j = jb + jj;
$tile_body
                    }
                }
                evo_transpose8x8(tile, rows);
                for (int64_t ww = 0; ww < 8; ++ww) {
                    const int64_t w = w0 + ww;
                    const int64_t j = jb;
                    memcpy(&out$slot[$pos], rows[ww], sizeof rows[ww]);
                }
            } else {
                for (int64_t ww = 0; ww < wn; ++ww) {
                    for (int64_t jj = 0; jj < jn; ++jj) {
                        const int64_t w = w0 + ww;
                        const int64_t j = jb + jj;
$body
                    }
                }
            }
        }
    }
    if (evo_zero) __atomic_fetch_or((int *)&c->zero_div, evo_zero, __ATOMIC_RELAXED);
}
