// NonMaxSuppression with exactly onnxruntime 1.31's CPU result, faster (issue 14). No onnxruntime dependency:
// evonnx_ort.cc wraps it as the `ai.evonnx::NonMaxSuppression` custom op, and tests build it standalone.
//
// What onnxruntime computes (onnxruntime/core/providers/cpu/object_detection/non_max_suppression{.cc,_helper.h}):
// for each batch, then each class, the candidates are the boxes whose score is above the score threshold (strictly;
// every box when there is none), taken best first from a std::priority_queue ordered by (score, lower index
// first); a candidate is kept unless SuppressByIOU holds against a box already kept in its class; the class stops
// at max_output_boxes_per_class kept boxes. Rows come out in (batch, class, selection) order.
//
// What is done differently, each with the same result:
// - Without NaN scores the priority queue pops in (score descending, index ascending) order, an order std::sort
//   gives with one comparison per pair (-0.0 == +0.0 ties, as in the queue). With a NaN score the queue's order
//   is not a strict weak ordering and depends on libstdc++'s heap code, so that class runs the very same queue.
// - SuppressByIOU(candidate, kept) is a pure predicate evaluated with the same float operations on per-box values
//   (min, max, area) that it derives the same way each time, so they are derived once per box.
// - A kept box that can suppress and a candidate it suppresses overlap with positive width and height, so they
//   share a cell of any grid whose cell index is a monotone function of the coordinate. A candidate is compared
//   only with the kept boxes in its cells (and with kept boxes too large to file by cell). Boxes that can never
//   suppress or be suppressed (a NaN or infinite coordinate, no positive width, height or finite area) are
//   never filed and never compared, which SuppressByIOU would have rejected every time.
// - Each (batch, class) is independent: they run in parallel and are concatenated in order.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <queue>
#include <utility>
#include <vector>

namespace evo_nms {

// One box as SuppressByIOU derives it (min and max along each axis, and the area from them).
struct Geom {
    float xmin, xmax, ymin, ymax, area;
    bool interacts;  // may suppress or be suppressed at all (see the file comment)
};

// std::max / std::min exactly: with a NaN they return their first argument.
inline float smax(float a, float b) { return (a < b) ? b : a; }
inline float smin(float a, float b) { return (b < a) ? b : a; }

// SuppressByIOU rounds every operation to float separately: no wider evaluation, and no a*b+c contracted into an
// FMA (the runtime is compiled with -ffp-contract=off, kernels/build.py).
static_assert(FLT_EVAL_METHOD == 0, "float arithmetic must be evaluated in float");

inline Geom geometry(const float* box, int64_t center_point_box) {
    Geom g{};
    if (center_point_box == 0) {  // [y1, x1, y2, x2], corners in either order
        if (box[1] >= box[3]) { g.xmin = box[3]; g.xmax = box[1]; } else { g.xmin = box[1]; g.xmax = box[3]; }
        if (box[0] >= box[2]) { g.ymin = box[2]; g.ymax = box[0]; } else { g.ymin = box[0]; g.ymax = box[2]; }
    } else {  // [x_center, y_center, width, height]
        const float hw = (box[2] / 2);
        const float hh = (box[3] / 2);
        g.xmin = (box[0] - hw);
        g.xmax = (box[0] + hw);
        g.ymin = (box[1] - hh);
        g.ymax = (box[1] + hh);
    }
    g.area = ((g.xmax - g.xmin) * (g.ymax - g.ymin));
    g.interacts = std::isfinite(g.xmin) && std::isfinite(g.xmax) && std::isfinite(g.ymin) &&
                  std::isfinite(g.ymax) && g.xmin < g.xmax && g.ymin < g.ymax && g.area > 0.0f &&
                  std::isfinite(g.area);
    return g;
}

// onnxruntime's SuppressByIOU(boxes, candidate, kept, center_point_box, iou_threshold), on derived boxes.
inline bool suppresses(const Geom& c, const Geom& k, float iou_threshold) {
    const float ixmin = smax(c.xmin, k.xmin);
    const float ixmax = smin(c.xmax, k.xmax);
    if (ixmax <= ixmin) return false;
    const float iymin = smax(c.ymin, k.ymin);
    const float iymax = smin(c.ymax, k.ymax);
    if (iymax <= iymin) return false;
    const float inter = ((ixmax - ixmin) * (iymax - iymin));
    if (inter <= 0.0f) return false;
    const float uni = ((c.area + k.area) - inter);
    if (c.area <= 0.0f || k.area <= 0.0f || uni <= 0.0f) return false;
    return (inter / uni) > iou_threshold;
}

constexpr int kMaxSpan = 64;  // a kept box over more cells than this is compared with every candidate instead

// A uniform grid over the interacting boxes of one batch; cell() is monotone in the coordinate. Cells are about the
// median box's size, so that most boxes fall in a few cells, with at most about 4 cells a box.
struct Grid {
    int gx = 1, gy = 1;  // cells along x and y
    double x0 = 0, y0 = 0, sx = 0, sy = 0;

    static Grid over(const std::vector<Geom>& boxes) {
        Grid g;
        double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
        std::vector<float> w, h;
        for (const Geom& b : boxes) {
            if (!b.interacts) continue;
            xlo = std::min<double>(xlo, b.xmin);
            xhi = std::max<double>(xhi, b.xmax);
            ylo = std::min<double>(ylo, b.ymin);
            yhi = std::max<double>(yhi, b.ymax);
            w.push_back(b.xmax - b.xmin);
            h.push_back(b.ymax - b.ymin);
        }
        const size_t n = w.size();
        // one cell (the plain kept list) for few boxes, or so many that the grid's int32 entries could overflow
        if (n < 64 || n > static_cast<size_t>(INT32_MAX / kMaxSpan)) return g;
        std::nth_element(w.begin(), w.begin() + n / 2, w.end());
        std::nth_element(h.begin(), h.begin() + n / 2, h.end());
        double cx = std::ceil((xhi - xlo) / w[n / 2]), cy = std::ceil((yhi - ylo) / h[n / 2]);
        cx = std::min(std::max(cx, 1.0), 4096.0);
        cy = std::min(std::max(cy, 1.0), 4096.0);
        const double most = std::max(64.0, 4.0 * static_cast<double>(n));
        if (cx * cy > most) {
            const double shrink = std::sqrt(most / (cx * cy));
            cx = std::max(1.0, std::floor(cx * shrink));
            cy = std::max(1.0, std::floor(cy * shrink));
        }
        g.gx = static_cast<int>(cx);
        g.gy = static_cast<int>(cy);
        g.x0 = xlo;
        g.y0 = ylo;
        g.sx = xhi > xlo ? g.gx / (xhi - xlo) : 0.0;
        g.sy = yhi > ylo ? g.gy / (yhi - ylo) : 0.0;
        return g;
    }
    static int cell(double v, double origin, double scale, int cells) {
        const double t = (v - origin) * scale;
        if (!(t >= 0.0)) return 0;
        if (t >= cells) return cells - 1;
        return static_cast<int>(t);
    }
    int cx(float v) const { return cell(v, x0, sx, gx); }
    int cy(float v) const { return cell(v, y0, sy, gy); }
};

// Scratch space of one class's selection, reused across the classes one worker runs.
struct Scratch {
    std::vector<std::pair<float, int64_t>> cand;
    std::vector<int32_t> head;      // per cell: the first entry, or -1
    std::vector<int32_t> next;      // per entry: the next entry in its cell, or -1
    std::vector<int32_t> entry_box; // per entry: the kept box
    std::vector<int32_t> big;       // kept boxes spanning too many cells to file
    std::vector<int32_t> all;       // every interacting kept box
};


// ORT's ScoreIndexPair order: a is below b when its score is lower, or equal with a higher index.
struct QueueLess {
    bool operator()(const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) const {
        return a.first < b.first || (a.first == b.first && a.second > b.second);
    }
};

// One (batch, class): appends the kept box indices, in selection order, to `out`.
inline void select_class(const std::vector<Geom>& boxes, const Grid& grid, const float* scores, int64_t n,
                         int64_t max_out, float iou_threshold, bool has_score_threshold, float score_threshold,
                         Scratch& s, std::vector<int64_t>& out) {
    // branch-free: every box is written, and the count advances past those that pass
    if (s.cand.size() < static_cast<size_t>(n)) s.cand.resize(static_cast<size_t>(n));
    size_t n_cand = 0;
    bool nan = false;
    if (has_score_threshold) {  // a NaN score never passes: `NaN > threshold` is false
        for (int64_t i = 0; i < n; ++i) {
            s.cand[n_cand] = {scores[i], i};
            n_cand += scores[i] > score_threshold ? 1 : 0;
        }
    } else {
        for (int64_t i = 0; i < n; ++i) {
            s.cand[static_cast<size_t>(i)] = {scores[i], i};
            nan = nan || scores[i] != scores[i];
        }
        n_cand = static_cast<size_t>(n);
    }
    if (n_cand == 0 || max_out <= 0) return;
    // few boxes can be kept: each candidate is compared with every kept box, which costs less than clearing a grid
    static const Grid kOneCell;
    const Grid& g = std::min<int64_t>(max_out, static_cast<int64_t>(n_cand)) >= 256 ? grid : kOneCell;
    s.head.assign(static_cast<size_t>(g.gx) * static_cast<size_t>(g.gy), -1);
    s.next.clear();
    s.entry_box.clear();
    s.big.clear();
    s.all.clear();
    int64_t kept = 0;

    auto consider = [&](int64_t index) -> bool {  // keeps `index` unless a kept box suppresses it
        const Geom& c = boxes[static_cast<size_t>(index)];
        if (c.interacts) {
            const int x0 = g.cx(c.xmin), x1 = g.cx(c.xmax), y0 = g.cy(c.ymin), y1 = g.cy(c.ymax);
            const bool wide = (x1 - x0 + 1) * (y1 - y0 + 1) > kMaxSpan;
            for (int32_t k : wide ? s.all : s.big) {
                if (suppresses(c, boxes[static_cast<size_t>(k)], iou_threshold)) return false;
            }
            if (!wide) {
                for (int y = y0; y <= y1; ++y) {
                    for (int x = x0; x <= x1; ++x) {
                        for (int32_t e = s.head[static_cast<size_t>(y) * g.gx + x]; e >= 0;
                             e = s.next[static_cast<size_t>(e)]) {
                            if (suppresses(c, boxes[static_cast<size_t>(s.entry_box[static_cast<size_t>(e)])],
                                           iou_threshold)) {
                                return false;
                            }
                        }
                    }
                }
            }
            s.all.push_back(static_cast<int32_t>(index));
            if (wide) {
                s.big.push_back(static_cast<int32_t>(index));
            } else {
                for (int y = y0; y <= y1; ++y) {
                    for (int x = x0; x <= x1; ++x) {
                        const size_t cell = static_cast<size_t>(y) * g.gx + x;
                        s.next.push_back(s.head[cell]);
                        s.entry_box.push_back(static_cast<int32_t>(index));
                        s.head[cell] = static_cast<int32_t>(s.next.size() - 1);
                    }
                }
            }
        }
        out.push_back(index);
        ++kept;
        return true;
    };

    if (!nan) {
        // best first, in chunks: a class that stops at max_out kept boxes orders little more than it uses
        const auto better = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
            return a.first > b.first || (a.first == b.first && a.second < b.second);
        };
        size_t done = 0;
        size_t chunk = static_cast<size_t>(std::min<int64_t>(std::max<int64_t>(2 * std::min<int64_t>(
                                                                 max_out, INT32_MAX), 64), INT32_MAX));
        while (done < n_cand && kept < max_out) {
            const size_t end = n_cand - done > chunk ? done + chunk : n_cand;
            if (end < n_cand) {
                std::nth_element(s.cand.begin() + done, s.cand.begin() + end, s.cand.begin() + n_cand, better);
            }
            std::sort(s.cand.begin() + done, s.cand.begin() + end, better);
            for (size_t i = done; i < end && kept < max_out; ++i) consider(s.cand[i].second);
            done = end;
            chunk *= 2;
        }
        return;
    }
    // onnxruntime's own queue, built from the candidates in index order in one step, popped to the end
    std::priority_queue<std::pair<float, int64_t>, std::vector<std::pair<float, int64_t>>, QueueLess> queue(
        QueueLess(), std::vector<std::pair<float, int64_t>>(s.cand.begin(), s.cand.begin() + n_cand));
    while (!queue.empty() && kept < max_out) {
        consider(queue.top().second);
        queue.pop();
    }
}

}  // namespace evo_nms
