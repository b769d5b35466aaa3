// ggml's own quantizer and reader for one block type: the peer the lab's GGUF readers are
// checked against (lab/examples/ggml_blocks.rs runs it; lab/src/quant/ggml_read.rs reads what it
// writes).
//   ggml_blocks TYPE_ID ROW INPUT.f32 BLOCKS_OUT VALUES_OUT
// quantizes the f32 values of INPUT in rows of ROW with ggml_quantize_chunk (no importance
// matrix), then reads the blocks back with the type's to_float.
#include <stdio.h>
#include <stdlib.h>

#include "ggml.h"

static void *slurp(const char *path, long *bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(*bytes);
    if (fread(p, 1, *bytes, f) != (size_t)*bytes) p = NULL;
    fclose(f);
    return p;
}

static int spill(const char *path, const void *p, size_t bytes) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, bytes, f) != bytes) return 1;
    return fclose(f);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: ggml_blocks TYPE_ID ROW INPUT.f32 BLOCKS_OUT VALUES_OUT\n");
        return 2;
    }
    enum ggml_type type = (enum ggml_type)atoi(argv[1]);
    long row = atol(argv[2]), bytes = 0;
    float *x = slurp(argv[3], &bytes);
    long n = bytes / 4;
    if (!x || row <= 0 || n % row != 0 || row % ggml_blck_size(type) != 0) {
        fprintf(stderr, "ggml_blocks: %s holds no whole rows of %ld values of type %s\n", argv[3], row, ggml_type_name(type));
        return 1;
    }
    size_t size = ggml_row_size(type, row) * (n / row);
    void *q = malloc(size);
    float *y = malloc(n * sizeof(float));
    ggml_quantize_chunk(type, x, q, 0, n / row, row, NULL);
    ggml_get_type_traits(type)->to_float(q, y, n);
    if (spill(argv[4], q, size) || spill(argv[5], y, n * sizeof(float))) {
        fprintf(stderr, "ggml_blocks: cannot write %s or %s\n", argv[4], argv[5]);
        return 1;
    }
    return 0;
}
