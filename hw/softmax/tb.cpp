// Testbench for softmax_stream: streams `rows` rows of `n` bf16 values (little-endian u16 from
// IN) through the design, each row twice (pass 1, then pass 2 once in_ready says so), writes the
// fp32 outputs (little-endian u32) to OUT and prints "cycles C": the clock edges from the one
// that takes the first beat to the one that shows the last output, both counted.
// Lanes past n in a row's last beat carry NaN: the design must mask them.
#include "Vsoftmax_stream.h"
#include "verilated.h"
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

static void die(const char* what) {
  std::fprintf(stderr, "tb: %s\n", what);
  std::exit(2);
}

int main(int argc, char** argv) {
  if (argc != 5) die("usage: sim N ROWS IN OUT");
  const long n = std::atol(argv[1]), rows = std::atol(argv[2]);
  if (n < 1 || n > (1L << 23) || rows < 1) die("N must be 1..2^23 and ROWS at least 1");
  const long lanes = sizeof(Vsoftmax_stream::in_data) / sizeof(Vsoftmax_stream::in_data[0]);
  std::vector<uint16_t> x(n * rows);
  FILE* in = std::fopen(argv[3], "rb");
  if (!in || std::fread(x.data(), 2, x.size(), in) != x.size()) die("cannot read N*ROWS bf16 values from IN");
  std::fclose(in);

  const long beats = (n + lanes - 1) / lanes;
  const long total_in = rows * 2 * beats, total_out = rows * beats;
  std::vector<uint32_t> y(n * rows);
  Vsoftmax_stream top;
  top.n = n;
  top.in_valid = 0;
  top.rst = 1;
  for (int i = 0; i < 4; i++) {
    top.clk = 0; top.eval();
    top.clk = 1; top.eval();
  }
  top.rst = 0;
  top.clk = 0; top.eval();

  long sent = 0, got = 0, edge = 0, first = -1, last = -1;
  const long limit = 64 + total_in * 4 + rows * 64;
  while (got < total_out) {
    if (edge > limit) die("no progress: the design stopped taking beats or giving outputs");
    // The beat on offer: row r, pass p, beat b of the row.
    const bool offer = sent < total_in;
    if (offer) {
      const long r = sent / (2 * beats), b = sent % beats;
      for (long j = 0; j < lanes; j++) {
        const long c = b * lanes + j;
        top.in_data[j] = c < n ? x[r * n + c] : 0x7FC0;
      }
    }
    top.in_valid = offer;
    const bool taken = offer && top.in_ready;
    top.clk = 1; top.eval();
    edge++;
    if (taken) {
      if (first < 0) first = edge;
      sent++;
    }
    if (top.out_valid) {
      const long r = got / beats, b = got % beats;
      for (long j = 0; j < lanes; j++) {
        const long c = b * lanes + j;
        if (c < n) y[r * n + c] = top.out_data[j];
      }
      got++;
      last = edge;
    }
    top.clk = 0; top.eval();
  }
  top.final();
  FILE* out = std::fopen(argv[4], "wb");
  if (!out || std::fwrite(y.data(), 4, y.size(), out) != y.size()) die("cannot write OUT");
  std::fclose(out);
  std::printf("cycles %ld\n", last - first + 1);
  return 0;
}
