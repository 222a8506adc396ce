// sample stand-in for coder's definition (code is not read by machine_nb)
export default { name: "coder" };
