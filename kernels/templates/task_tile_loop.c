        for (int64_t r = first; r < end; ++r) {
            int64_t row = r / jblocks / wchunks;
            const int64_t wc = r / jblocks % wchunks;
            const int64_t jb = r % jblocks * 16;
            const int64_t jn = ext - jb < 16 ? ext - jb : 16;
$unravel
            /* blocks along w start where the strided input's rows are aligned to a block (8 of its elements): block
             * 0 is cut to the first wshift elements, and the last chunk takes the block this adds at the end */
            const int64_t wshift = $wshift;
            const int64_t wbend = wc == wchunks - 1 ? (wext + wshift + 7) / 8 : (wc + 1) * EVO_TILE_CHUNK;
            /* streamed, the unit runs its blocks of w once, each 16 along j (whole output lines); cached, once per 8
             * along j, so that 8 strided input rows are read at a time (16 at a time ran 10% slower on YOLOX's
             * [1, 85, 80, 80] head, whose output the cache holds) */
            const int64_t passes = $streamed ? 1 : (jn + 7) / 8;
            for (int64_t pass = 0; pass < passes; ++pass) {
                const int64_t jlo = $streamed ? jb : jb + 8 * pass;
                const int64_t jhi = $streamed ? jb + jn : (jlo + 8 < jb + jn ? jlo + 8 : jb + jn);
                for (int64_t wbk = wc * EVO_TILE_CHUNK; wbk < wbend; ++wbk) {
                    const int64_t w0 = wbk * 8 - wshift;
                    const int64_t wlo = w0 < 0 ? -w0 : 0;
                    const int64_t wn = wext - w0 < 8 ? wext - w0 : 8;
$row_loop
                    if ($streamed && wlo == 0 && wn == 8 && jn == 16) {
                        $ctype tile[16][8];
                        for (int64_t jj = 0; jj < 16; ++jj) {
                            for (int64_t ww = 0; ww < 8; ++ww) {
                                const int64_t w = w0 + ww;
                                const int64_t j = jb + jj;
$tile_body
                            }
                        }
                        const int64_t w = w0;
                        const int64_t j = jb;
                        evo_transpose16x8_to(tile, &out$slot[$pos], $wstride);
                        continue;
                    }
                    for (int64_t jb8 = jlo; jb8 < jhi; jb8 += 8) {
                        const int64_t jn8 = jhi - jb8 < 8 ? jhi - jb8 : 8;
                        if (wlo == 0 && wn == 8 && jn8 == 8) {
                            $ctype tile[8][8];
                            for (int64_t jj = 0; jj < 8; ++jj) {
                                for (int64_t ww = 0; ww < 8; ++ww) {
                                    const int64_t w = w0 + ww;
                                    const int64_t j = jb8 + jj;
$tile_body8
                                }
                            }
                            const int64_t w = w0;
                            const int64_t j = jb8;
                            evo_transpose8x8_to(tile, &out$slot[$pos], $wstride);
                        } else {
                            for (int64_t ww = wlo; ww < wn; ++ww) {
                                for (int64_t jj = 0; jj < jn8; ++jj) {
                                    const int64_t w = w0 + ww;
                                    const int64_t j = jb8 + jj;
$body
                                }
                            }
                        }
                    }
                }
            }
        }
