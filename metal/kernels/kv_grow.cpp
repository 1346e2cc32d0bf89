// Cache growth and window compaction without a host synchronisation (tqbridge kernel dialect):
// copies rows row0 .. row0 + n - 1 of the old K and V buffers to rows 0 .. n - 1 of new ones. The rows were written in place by kv_append, which MLX's
// graph does not know about; taking the latest append flag as an input orders this copy after those
// writes. Rows past the old capacity are left as allocated (never read before they are written).
//
// One thread per 16-bit unit (every row size is even). Buffers: ko, vo (old, (BH, old_cap, row)),
// flag (ordering only), params (uint32: BH, n, old_cap, new_cap, k_row_bytes / 2, v_row_bytes / 2, row0).
// Out: kn, vn ((BH, new_cap, row) uint8).
const uint bh_n = params[0], n = params[1], old_cap = params[2], new_cap = params[3];
const uint kh = params[4], vh = params[5], row0 = params[6];
const size_t i = (size_t)tq_gx * (size_t)tq_tg_size + (size_t)tq_tid;
const size_t k_units = (size_t)bh_n * (size_t)n * (size_t)kh;
const size_t v_units = (size_t)bh_n * (size_t)n * (size_t)vh;
(void)flag;
if (i < k_units) {
    const size_t per = (size_t)n * (size_t)kh;
    const size_t bh = i / per, w = i % per;
    ((TQ_DEVICE ushort*)kn)[bh * (size_t)new_cap * (size_t)kh + w] =
        ((TQ_CONST_DEVICE ushort*)ko)[(bh * (size_t)old_cap + (size_t)row0) * (size_t)kh + w];
} else if (i < k_units + v_units) {
    const size_t j = i - k_units;
    const size_t per = (size_t)n * (size_t)vh;
    const size_t bh = j / per, w = j % per;
    ((TQ_DEVICE ushort*)vn)[bh * (size_t)new_cap * (size_t)vh + w] =
        ((TQ_CONST_DEVICE ushort*)vo)[(bh * (size_t)old_cap + (size_t)row0) * (size_t)vh + w];
}
