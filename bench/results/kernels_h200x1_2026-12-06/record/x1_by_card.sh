# One GPU, whichever card comes: on an H200 the kernel benchmark of record (h200x1_kernels_queued.sh), on
# any other card the moe_experts op's numerics and the CTA decode-tile stages (x1_moe_op_cta.sh).
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "=== card: $CARD"
case "$CARD" in
  *H200*) source "$(dirname "$STAGES")/h200x1_kernels_queued.sh" ;;
  *) source "$(dirname "$STAGES")/x1_moe_op_cta.sh" ;;
esac
