// Row-wise softmax as a streaming dataflow design: LANES elements a cycle, online normalization
// (running max m and rescaled sum d in base 2), then a second pass over the row for the outputs.
// lab/src/ops/fpga/model.rs is the same arithmetic in Rust, written to be read; hw/softmax/README.md
// states the number format, each unit's error bound and the cycle count.
//
// Per row the host streams ceil(n/LANES) beats (pass 1), waits while in_ready is low (the
// reduction), then streams the same beats again (pass 2); outputs leave OUT_LATENCY cycles after
// each pass-2 beat. Lanes past n in the last beat are masked whatever they hold.
module softmax_stream #(
    parameter int LANES = 4
) (
    input  logic        clk,
    input  logic        rst,
    input  logic [23:0] n,                  // row length, 1 .. 2^23, fixed while rows stream
    input  logic        in_valid,
    output logic        in_ready,
    input  logic [15:0] in_data [LANES],    // bf16
    output logic        out_valid,
    output logic [31:0] out_data [LANES]    // fp32
);
  localparam int LOG2L = $clog2(LANES);
  // Cycles in_ready is low between the passes: the last accumulate, the lane tree, two
  // reciprocal stages and the latch of the row's (m, 1/d).
  localparam int RED_LAST = 3 + LOG2L;
  localparam logic [24:0] LOG2E_Q24 = 25'd24204406;  // round(log2(e) * 2^24)
  localparam logic [39:0] MAG_MAX = 40'h7F_FFFF_FFFF;  // saturation of |t|
  localparam logic [63:0] ONE = 64'h100_0000_0000;     // 1.0 in the sum's Q.40
  localparam logic [1:0] K_VALUE = 2'd0, K_MASKED = 2'd1, K_POISON = 2'd2;

  typedef logic signed [39:0] t_t;  // x * log2(e) in signed Q23.16
  typedef struct packed {
    logic valid;   // has seen a finite element
    logic poison;  // has seen NaN or +inf
    t_t m;
    logic [63:0] d;  // Q.40
  } acc_t;

  // 2^(i/256) in Q1.30, i = 0..256; 1/(1 + (i + 0.5)/1024) in Q0.32, i = 0..1023.
  logic [30:0] EXP2_LUT [257];
  logic [31:0] RECIP_LUT [1024];
  initial begin
    $readmemh("exp2_lut.mem", EXP2_LUT);
    $readmemh("recip_lut.mem", RECIP_LUT);
  end

  // bf16 -> t = round(x * log2(e) * 2^16), |t| saturated at 2^39 - 1; zero and subnormals -> 0.
  function automatic logic [41:0] convert(input logic [15:0] b);  // {kind, t}
    logic [7:0] e;
    logic [32:0] p;
    logic [79:0] wide;
    logic [39:0] mag;
    int sh;
    e = b[14:7];
    if (e == 8'hFF) return {(b[6:0] == 0 && b[15]) ? K_MASKED : K_POISON, 40'd0};
    if (e == 0) return {K_VALUE, 40'd0};
    p = {25'd0, 1'b1, b[6:0]} * {8'd0, LOG2E_Q24};
    sh = int'(e) - 142;
    if (sh >= 8) mag = MAG_MAX;
    else if (sh >= 0) begin
      wide = {47'd0, p} << sh;
      mag = wide > {40'd0, MAG_MAX} ? MAG_MAX : wide[39:0];
    end else if (sh <= -40) mag = 0;
    else begin
      wide = ({47'd0, p} + (80'd1 << (-sh - 1))) >> (-sh);  // round half up
      mag = wide[39:0];
    end
    return {K_VALUE, b[15] ? -mag : mag};
  endfunction

  // 2^a for a <= 0 (Q.16) in Q0.40: the table at the top 8 fraction bits, linear interpolation
  // on the low 8, shifted right by the integer part (truncating).
  function automatic logic [40:0] exp2q(input logic signed [40:0] a);
    logic signed [40:0] ip;
    logic [8:0] idx;
    logic [7:0] w;
    logic [30:0] lo, hi, v;
    logic [38:0] step;
    logic [40:0] k;
    ip = a >>> 16;
    idx = {1'b0, a[15:8]};
    w = a[7:0];
    lo = EXP2_LUT[idx];
    hi = EXP2_LUT[idx+1];
    step = ({8'd0, hi - lo} * {31'd0, w}) >> 8;
    v = lo + step[30:0];
    k = -ip;
    if (k > 41) return 0;
    return ({10'd0, v} << 10) >> k;
  endfunction

  // (d * e) >> 40: d rescaled by a factor e <= 1 in Q0.40.
  function automatic logic [63:0] scale(input logic [63:0] d, input logic [40:0] e);
    logic [104:0] p;
    p = {41'd0, d} * {64'd0, e};
    return p[103:40];
  endfunction

  function automatic logic signed [40:0] diff(input t_t a, input t_t b);
    return {a[39], a} - {b[39], b};
  endfunction

  // One element into a lane's running (m, d).
  function automatic acc_t update(input acc_t s, input t_t t);
    acc_t r;
    r = s;
    if (!s.valid) begin
      r.valid = 1;
      r.m = t;
      r.d = ONE;
    end else if (t > s.m) begin
      r.m = t;
      r.d = scale(s.d, exp2q(diff(s.m, t))) + ONE;
    end else r.d = s.d + {23'd0, exp2q(diff(t, s.m))};
    return r;
  endfunction

  // Two running (m, d) into one, each sum rescaled to the larger max.
  function automatic acc_t combine(input acc_t a, input acc_t b);
    acc_t r;
    t_t mx;
    if (!a.valid) r = b;
    else if (!b.valid) r = a;
    else begin
      mx = a.m > b.m ? a.m : b.m;
      r.valid = 1;
      r.m = mx;
      r.d = scale(a.d, exp2q(diff(a.m, mx))) + scale(b.d, exp2q(diff(b.m, mx)));
    end
    r.poison = a.poison | b.poison;
    return r;
  endfunction

  // P * 2^-72 * 2^-k as fp32, mantissa truncated; below the normal range -> 0.
  function automatic logic [31:0] to_f32(input logic [73:0] p, input logic [4:0] k);
    int q, ex;
    logic [73:0] mant;
    if (p == 0) return 0;
    q = 0;
    for (int i = 0; i < 74; i++) if (p[i]) q = i;
    ex = q + 55 - int'(k);
    if (ex <= 0) return 0;
    mant = q >= 23 ? p >> (q - 23) : p << (23 - q);
    return {1'b0, ex[7:0], mant[22:0]};
  endfunction

  // ---- control: pass 1, reduction, pass 2 ----
  typedef enum logic [1:0] {PASS1, REDUCE, PASS2} state_t;
  state_t state;
  logic [23:0] beat, beats;
  logic [7:0] red_cycle;
  assign beats = 24'((32'(n) + LANES - 1) >> LOG2L);
  assign in_ready = state != REDUCE;
  wire accept = in_valid && in_ready;
  wire latch_row = state == REDUCE && red_cycle == 8'(RED_LAST);

  always_ff @(posedge clk) begin
    if (rst) begin
      state <= PASS1;
      beat <= 0;
      red_cycle <= 0;
    end else begin
      if (accept) beat <= beat == beats - 1 ? 0 : beat + 1;
      if (accept && beat == beats - 1) state <= state == PASS1 ? REDUCE : PASS1;
      red_cycle <= state == REDUCE ? red_cycle + 1 : 0;
      if (latch_row) state <= PASS2;
    end
  end

  // ---- stage 1: convert (both passes) ----
  logic cv_valid, cv_pass2;
  logic [1:0] cv_kind [LANES];
  t_t cv_t [LANES];
  always_ff @(posedge clk) begin
    cv_valid <= !rst && accept;
    cv_pass2 <= state == PASS2;
    for (int j = 0; j < LANES; j++) begin
      logic [41:0] c;
      c = convert(in_data[j]);
      // Lanes past the end of the row are masked, whatever they hold.
      cv_kind[j] <= 32'(beat) * LANES + j < 32'(n) ? c[41:40] : K_MASKED;
      cv_t[j] <= c[39:0];
    end
  end

  // ---- pass 1: a running (m, d) per lane, then a tree of combines, one level a cycle ----
  acc_t level [LOG2L+1][LANES];
  always_ff @(posedge clk) begin
    for (int j = 0; j < LANES; j++) begin
      if (rst || latch_row) level[0][j] <= '0;
      else if (cv_valid && !cv_pass2) begin
        if (cv_kind[j] == K_POISON) level[0][j].poison <= 1;
        else if (cv_kind[j] == K_VALUE) level[0][j] <= update(level[0][j], cv_t[j]);
      end
    end
    for (int l = 1; l <= LOG2L; l++)
      for (int i = 0; i < (LANES >> l); i++) level[l][i] <= combine(level[l-1][2*i], level[l-1][2*i+1]);
  end

  // ---- reciprocal of d: normalize to [1, 2), 1024-entry seed, one Newton step ----
  acc_t rc1, rc2;
  logic [32:0] rc1_dn;  // Q1.32
  logic [31:0] rc1_r0;  // Q0.32
  logic [4:0] rc1_k, rc2_k;
  logic [32:0] rc2_r;   // Q0.32, <= 1.0
  always_ff @(posedge clk) begin
    acc_t root;
    int p;
    logic [63:0] dn;
    root = level[LOG2L][0];
    p = 40;
    for (int i = 40; i < 64; i++) if (root.d[i]) p = i;
    dn = root.d >> (p - 32);
    rc1 <= root;
    rc1_k <= 5'(p - 40);
    rc1_dn <= dn[32:0];
    rc1_r0 <= RECIP_LUT[dn[31:22]];
  end
  always_ff @(posedge clk) begin
    logic [64:0] prod;
    logic [65:0] two_minus;
    logic [97:0] r;
    prod = {32'd0, rc1_dn} * {33'd0, rc1_r0};
    two_minus = (66'd1 << 65) - {1'b0, prod};
    r = {66'd0, rc1_r0} * {32'd0, two_minus};
    rc2 <= rc1;
    rc2_k <= rc1_k;
    rc2_r <= r[96:64];
  end

  // The row's (m, 1/d), held through its pass 2 (the next latch comes >= 2 beats + RED_LAST
  // cycles after the last pass-2 beat, later than the output pipeline drains).
  acc_t row;
  logic [32:0] row_r;
  logic [4:0] row_k;
  always_ff @(posedge clk)
    if (latch_row) begin
      row <= rc2;
      row_r <= rc2_r;
      row_k <= rc2_k;
    end

  // ---- pass 2: 2^(t - m), then * 1/d and to fp32 ----
  logic ev_valid;
  logic [1:0] ev_kind [LANES];
  logic [40:0] ev_e [LANES];
  always_ff @(posedge clk) begin
    ev_valid <= !rst && cv_valid && cv_pass2;
    for (int j = 0; j < LANES; j++) begin
      ev_kind[j] <= cv_kind[j];
      ev_e[j] <= cv_kind[j] == K_VALUE && row.valid ? exp2q(diff(cv_t[j], row.m)) : 0;
    end
  end
  always_ff @(posedge clk) begin
    out_valid <= !rst && ev_valid;
    for (int j = 0; j < LANES; j++)
      if (row.poison) out_data[j] <= 32'h7FC0_0000;
      else if (ev_kind[j] != K_VALUE || !row.valid) out_data[j] <= 0;
      else out_data[j] <= to_f32({33'd0, ev_e[j]} * {41'd0, row_r}, row_k);
  end
endmodule
