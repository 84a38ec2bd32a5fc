
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
    const int64_t jblocks = (ext + 15) / 16;
    const int64_t wchunks = (wblocks + EVO_TILE_CHUNK - 1) / EVO_TILE_CHUNK;
    /* past EVO_STREAM_BYTES of output, and where the output rows along w are whole cache lines apart, the lines are
     * stored around the cache (EVO_STORE16; a constant where the sizes are). Rows 340 bytes apart (YOLO's 85) start
     * a line once in 16: streamed, they ran 8% slower than cached */
    const int stream = ($wstride) * sizeof(${ctype}) % 64 == 0
                       && (double)($rows) * (double)wext * (double)ext * sizeof(${ctype}) >= EVO_STREAM_BYTES;
    /* the loop twice, streamed and cached, each compiled on its own: the streamed path's code beside the cached one
     * slowed the cached one by 4-10% (gcc's choices for the shared loop nest) */
    if (stream) {
$loop_streamed
    } else {
$loop_cached
    }
    evo_stream_fence(stream);
    if (evo_zero) __atomic_fetch_or((int *)&c->zero_div, evo_zero, __ATOMIC_RELAXED);
}
