var t=[{match:/[^,\[\->+.<\]\s].*/g,type:"cmnt",sub:"todo"},{type:"func",match:/\.+/g},{type:"kwd",match:/[<>]+/g},{type:"oper",match:/[+-]+/g}];export{t as default};
