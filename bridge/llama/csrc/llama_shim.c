/*
 * tqbridge's shim over one llama.cpp build's public API (llama.h, ggml.h).
 *
 * Compiled by tqbridge.bridge.llama.build against the headers of the build it is linked with, so the
 * compiler lays out llama_context_params and llama_model_params for that build: llama.cpp's structs
 * change between versions and forks (fields added, reordered), and a ctypes mirror written for one
 * llama.h corrupts memory on another. Every function here takes and returns plain scalars and
 * pointers, so its ctypes signature is the same for every build.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "llama.h"

static int tqs_quiet = 1;
static char tqs_error[512];   /* the last error llama.cpp logged, for one-line messages */

/* llama.cpp's log since the last tqs_log_take: each message as a record separator (0x1e), one level
 * byte ('0' + ggml_log_level) and its text, so the caller can split it into lines and keep the levels it wants. Bounded:
 * past TQS_LOG_CAP bytes the oldest text is dropped and tqs_log_dropped counts it. */
#define TQS_LOG_CAP (1u << 20)
static char * tqs_log_buf = NULL;
static size_t tqs_log_len = 0;
static size_t tqs_log_dropped = 0;
static int tqs_log_min = GGML_LOG_LEVEL_INFO;

static void tqs_log_keep(enum ggml_log_level level, const char * text) {
    size_t n = strlen(text);
    if (tqs_log_buf == NULL) {
        tqs_log_buf = (char *) malloc(TQS_LOG_CAP);
        if (tqs_log_buf == NULL) {
            return;
        }
    }
    if (n + 2 > TQS_LOG_CAP) {
        tqs_log_dropped += n;
        return;
    }
    if (tqs_log_len + n + 2 > TQS_LOG_CAP) {
        tqs_log_dropped += tqs_log_len;
        tqs_log_len = 0;
    }
    tqs_log_buf[tqs_log_len++] = '\x1e';
    tqs_log_buf[tqs_log_len++] = (char) ('0' + (int) level);
    memcpy(tqs_log_buf + tqs_log_len, text, n);
    tqs_log_len += n;
}

static void tqs_log(enum ggml_log_level level, const char * text, void * user) {
    (void) user;
    if (level == GGML_LOG_LEVEL_ERROR) {
        strncpy(tqs_error, text, sizeof(tqs_error) - 1);
        tqs_error[sizeof(tqs_error) - 1] = 0;
    }
    if (level >= tqs_log_min || level == GGML_LOG_LEVEL_CONT) {
        tqs_log_keep(level, text);
    }
    if (!tqs_quiet && level >= GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

/* Copies at most n bytes of the kept log into out and forgets what was copied; returns the count.
 * tqs_log_pending: bytes kept now. */
size_t tqs_log_pending(void) { return tqs_log_len; }

size_t tqs_log_take(char * out, size_t n) {
    size_t m = n < tqs_log_len ? n : tqs_log_len;
    if (m > 0) {
        memcpy(out, tqs_log_buf, m);
        memmove(tqs_log_buf, tqs_log_buf + m, tqs_log_len - m);
        tqs_log_len -= m;
    }
    return m;
}

size_t tqs_log_lost(void) { return tqs_log_dropped; }

const char * tqs_last_error(void) { return tqs_error; }

void tqs_init(int quiet) {
    tqs_quiet = quiet;
    llama_log_set(tqs_log, NULL);
    llama_backend_init();
}

int tqs_type_count(void) { return (int) GGML_TYPE_COUNT; }

void * tqs_model_load(const char * path) {
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    return llama_model_load_from_file(path, mp);
}

void tqs_model_free(void * model) { llama_model_free((struct llama_model *) model); }

int tqs_n_vocab(void * model) {
    return llama_vocab_n_tokens(llama_model_get_vocab((const struct llama_model *) model));
}

/* A CPU context with flash attention on or off, cache types by ggml type id, an optional eval callback. */
void * tqs_context(void * model, uint32_t n_ctx, uint32_t n_batch, uint32_t n_ubatch, int32_t n_threads,
                   int flash_attn, int type_k, int type_v, void * cb_eval, void * cb_user) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.n_ubatch = n_ubatch;
    cp.n_seq_max = 1;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.flash_attn_type = flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = (enum ggml_type) type_k;
    cp.type_v = (enum ggml_type) type_v;
    cp.cb_eval = (ggml_backend_sched_eval_callback) cb_eval;
    cp.cb_eval_user_data = cb_user;
    cp.offload_kqv = false;
    cp.no_perf = true;
    return llama_init_from_model((struct llama_model *) model, cp);
}

void tqs_free(void * ctx) { llama_free((struct llama_context *) ctx); }

/* Evaluates n tokens at positions pos0.. of sequence 0 as one batch. With logits != NULL every
 * position's logits are written there (n x n_vocab floats); otherwise only the last is computed.
 * Returns llama_decode's result. */
int tqs_decode(void * ctx, const int32_t * tokens, int32_t n, int32_t pos0, float * logits, int32_t n_vocab) {
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int32_t i = 0; i < n; i++) {
        b.token[i] = tokens[i];
        b.pos[i] = pos0 + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = (int8_t) (logits != NULL || i == n - 1);
    }
    b.n_tokens = n;
    int rc = llama_decode((struct llama_context *) ctx, b);
    if (rc == 0 && logits != NULL) {
        for (int32_t i = 0; i < n; i++) {
            const float * row = llama_get_logits_ith((struct llama_context *) ctx, i);
            if (row == NULL) {
                rc = -100;
                break;
            }
            memcpy(logits + (size_t) i * n_vocab, row, sizeof(float) * (size_t) n_vocab);
        }
    }
    llama_batch_free(b);
    return rc;
}

/* The last evaluated position's logits (n_vocab floats). */
const float * tqs_last_logits(void * ctx) { return llama_get_logits_ith((struct llama_context *) ctx, -1); }

size_t tqs_state_size(void * ctx) { return llama_state_seq_get_size((struct llama_context *) ctx, 0); }

size_t tqs_state_get(void * ctx, uint8_t * buf, size_t size) {
    return llama_state_seq_get_data((struct llama_context *) ctx, buf, size, 0);
}

size_t tqs_state_set(void * ctx, const uint8_t * buf, size_t size) {
    return llama_state_seq_set_data((struct llama_context *) ctx, buf, size, 0);
}

/* llama.cpp's tokenizer: writes at most n_max ids; returns their count, or minus the count needed. */
int32_t tqs_tokenize(void * model, const char * text, int32_t len, int32_t * out, int32_t n_max, int add_special) {
    const struct llama_vocab * vocab = llama_model_get_vocab((const struct llama_model *) model);
    return llama_tokenize(vocab, text, len, out, n_max, add_special != 0, false);
}
