
/* $kernel: $note */
EVO_TASK(${fname}) {
    const ${kernel}_ctx *c = (const ${kernel}_ctx *)vctx;
    const evo_range *rg = &c->ranges[$range];
    int evo_zero = 0; /* 1: an integer divisor was 0 (evo_nz_*); 2: an index out of range (evo_pick) */
$bindings
    const int64_t lext = $lane_extent;
    const int64_t ext = $inner_extent;
    int64_t first = (int64_t)task * rg->per;
    int64_t end = first + rg->per < rg->total ? first + rg->per : rg->total;
    const int64_t lblocks = (lext + 7) / 8;
    for (int64_t r = first; r < end; ++r) {
        int64_t row = r / lblocks;
$unravel
        const int64_t l0 = r % lblocks * 8;
        const int64_t ln = lext - l0 < 8 ? lext - l0 : 8;
        if (ln == 8) {
            /* a whole block: every lane loop has the constant trip count 8, one vector each, with no loop
             * overhead (each reduction step of a block is one such loop) */
            const int64_t ln = 8;
            const int64_t skip = 0;
$unit
        } else if (lext >= 8) {
            /* the last block, short: moved back to end at lext, so that it runs as a whole one; its first lanes
             * belong to the block before, which stores them (the lanes' loops that store start at skip) */
            const int64_t skip = 8 - ln;
            const int64_t l0 = lext - 8;
            const int64_t ln = 8;
$unit
        } else {
            const int64_t skip = 0;
$unit
        }
    }
    (void)ext;
    if (evo_zero) __atomic_fetch_or((int *)&c->zero_div, evo_zero, __ATOMIC_RELAXED);
}
