
/* $kernel: $note */
EVO_TASK(${fname}) {
    const ${kernel}_ctx *c = (const ${kernel}_ctx *)vctx;
    const evo_range *rg = &c->ranges[$range];
    int evo_zero = 0; /* 1: an integer divisor was 0 (evo_nz_*); 2: an index out of range (evo_pick) */
$bindings
    const int64_t ext = $inner_extent;
    int64_t f = (int64_t)task * rg->per;
    int64_t fend = f + rg->per < rg->total ? f + rg->per : rg->total;
    int64_t j0 = f % ext;
    int64_t row = f / ext;
$unravel
    while (f < fend) {
        int64_t stop = j0 + (fend - f) < ext ? j0 + (fend - f) : ext;
$row_body
$loop
        f += stop - j0;
        j0 = 0;
$advance
    }
    if (evo_zero) __atomic_fetch_or((int *)&c->zero_div, evo_zero, __ATOMIC_RELAXED);
}
