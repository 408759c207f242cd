# One GPU, whichever card comes: on an H100 the collective GEMMs' cuBLAS paths (h100x1_cublas_paths.sh), on an
# H200 the CTA op's 4-rank GPU tests with stage 1's decode tiles (h200x1_cta_decode.sh).
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "=== card: $CARD"
case "$CARD" in
  *H100*) source "$(dirname "$STAGES")/h100x1_cublas_paths.sh" ;;
  *) source "$(dirname "$STAGES")/h200x1_cta_decode.sh" ;;
esac
